//go:build race

package dlock_test

// raceDetector is set when the tests run with -race.
const raceDetector = true
