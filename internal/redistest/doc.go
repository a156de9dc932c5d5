// Package redistest starts real redis-server (and redis-sentinel) processes
// for tests: single servers, a primary with replicas watched by sentinels, a
// Redis Cluster, and sets of independent servers for Redlock.
//
// Every process is started by this package on a free 127.0.0.1 port in a
// temporary directory, with its log in that directory, and is stopped by PID
// in a testing.TB cleanup. The package never signals or shuts down a process
// it did not start. On Linux the processes also die with the test binary
// (Pdeathsig).
//
// If redis-server (or redis-cli / redis-sentinel where needed) is not on
// PATH, the test fails with a message saying how to install it; tests are
// never skipped silently.
//
// The package also provides VerifyNoLeaks, a standard-library goroutine leak
// check for TestMain.
package redistest
