module github.com/dlockio/dlock/redigo

go 1.24

require (
	github.com/dlockio/dlock v0.0.0
	github.com/gomodule/redigo v1.9.3
)

replace github.com/dlockio/dlock => ../
