package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at link time for releases:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/dlock
//
// Otherwise it is read from the build information: the module version for
// `go install github.com/dlockio/dlock/cmd/dlock@VERSION`, else "(devel)".
var version string

var versionCommand = new(command)

func init() {
	*versionCommand = command{
		name:    "version",
		summary: "print dlock's version",
		usage:   "version",
		help: `Prints the version of dlock, the VCS revision it was built from when known,
and the Go version and platform. Also: dlock --version, which takes no
arguments either.
`,
		flags: func(fs *flag.FlagSet) func(*app, []string) error {
			return func(a *app, args []string) error {
				if err := wantArgs(versionCommand, args, 0, 0, ""); err != nil {
					return err
				}
				return printVersion(a.stdout)
			}
		},
	}
}

func printVersion(w io.Writer) error {
	v, rev := version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && dirty {
			rev += "+dirty"
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if rev != "" {
		rev = " " + rev
	}
	_, err := fmt.Fprintf(w, "dlock %s%s %s %s/%s\n", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}
