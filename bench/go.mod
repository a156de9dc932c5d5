module github.com/dlockio/dlock/bench

go 1.26.0

require (
	github.com/bsm/redislock v0.9.4
	github.com/dlockio/dlock v0.0.0
	github.com/dlockio/dlock/redigo v0.0.0
	github.com/dlockio/dlock/rueidis v0.0.0
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/gomodule/redigo v1.9.3
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// dlock and its drivers come from this repository.
replace (
	github.com/dlockio/dlock => ../
	github.com/dlockio/dlock/redigo => ../redigo
	github.com/dlockio/dlock/rueidis => ../rueidis
)
