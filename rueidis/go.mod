module github.com/dlockio/dlock/rueidis

go 1.25.0

require (
	github.com/dlockio/dlock v0.0.0
	github.com/redis/rueidis v1.0.79
)

require golang.org/x/sys v0.47.0 // indirect

replace github.com/dlockio/dlock => ../
