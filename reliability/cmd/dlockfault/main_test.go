package main

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	isWorker() // the pause scenario runs this binary again as its workers
	os.Exit(m.Run())
}
