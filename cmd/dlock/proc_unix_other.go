//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

func setParentDeathSignal(*syscall.SysProcAttr) {}

// inForeground cannot tell here; run then forwards every signal.
func inForeground() bool { return false }

func termWidth(*os.File) int { return 0 }
