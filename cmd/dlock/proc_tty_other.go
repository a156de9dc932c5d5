//go:build unix && !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import "os"

// inForeground cannot tell here; run then forwards every signal.
func inForeground() bool { return false }

func termWidth(*os.File) int { return 0 }
