package main

import (
	"os"
	"testing"

	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	isWorker() // the pause scenario runs this binary again as its workers
	os.Exit(redistest.RunWithoutLeaks(m))
}
