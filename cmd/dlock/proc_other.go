//go:build !unix

package main

import (
	"os"
	"syscall"
)

var forwarded = []os.Signal{os.Interrupt}

var brokenPipe []os.Signal

func stopsWait(os.Signal) bool                               { return true }
func fromTerminal(os.Signal) bool                            { return false }
func hasControllingTerminal() bool                           { return false }
func inForeground() bool                                     { return false }
func termSize(*os.File) (cols, rows int)                     { return 0, 0 }
func childAttr(bool) *syscall.SysProcAttr                    { return nil }
func signalChild(p *os.Process, _ bool, sig os.Signal) error { return p.Signal(sig) }
func groupAlive(int) bool                                    { return false }
func processGone(int) bool                                   { return false }

var (
	termSignal os.Signal = os.Kill
	killSignal os.Signal = os.Kill
)
