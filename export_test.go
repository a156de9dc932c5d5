package dlock

// PauseWatchdog stops c's watchdog from refreshing anything until resume is
// called, as a stopped process (GC pause, SIGSTOP) would: tests use it to
// let a lock run out under its holder.
func PauseWatchdog(c *Client) (resume func()) {
	w := c.watchdog()
	w.gate.Lock()
	return w.gate.Unlock
}
