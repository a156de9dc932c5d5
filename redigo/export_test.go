package redigo

import "time"

// SetPing sets how often subscriptions started from now on ping their
// connection, and how long a silent one lasts, until restore is called.
func SetPing(every, silent time.Duration) (restore func()) {
	e, s := pingEvery, silentFor
	pingEvery, silentFor = every, silent
	return func() { pingEvery, silentFor = e, s }
}
