package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/dlockio/dlock"
)

// The metadata keys run stores by default. Metadata is a JSON object of
// strings; locks taken by other programs may hold any string.
const (
	metaHost = "host"
	metaPID  = "pid"
	metaUser = "user"
	metaCmd  = "cmd"
)

// parseMeta reads metadata written as a JSON object; nil if it is not one.
func parseMeta(s string) map[string]string {
	if !strings.HasPrefix(strings.TrimSpace(s), "{") {
		return nil
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &raw) != nil {
		return nil
	}
	m := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			m[k] = s
		} else {
			// As written: a number keeps its digits, an object its order.
			m[k] = string(v)
		}
	}
	return m
}

// whoHolds names a holder in a few words: "host-a pid 4242".
func whoHolds(h dlock.Holder) string {
	m := parseMeta(h.Metadata)
	var parts []string
	if m[metaHost] != "" {
		parts = append(parts, printable(m[metaHost]))
	}
	if m[metaPID] != "" {
		parts = append(parts, "pid "+printable(m[metaPID]))
	}
	switch {
	case len(parts) > 0:
		return strings.Join(parts, " ")
	case len(m) > 0:
		return truncate(formatExtra(m, nil), 60)
	case h.Metadata != "":
		return truncate(h.Metadata, 60)
	case h.Owner != "":
		return "owner " + truncate(h.Owner, 40)
	}
	return "a holder with no metadata"
}

// formatExtra writes the metadata keys not in skip as k=v, sorted.
func formatExtra(m map[string]string, skip map[string]bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		if !skip[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		v := m[k]
		if v == "" || strings.ContainsAny(v, " \"'") || strings.IndexFunc(v, notPrintable) >= 0 {
			v = fmt.Sprintf("%q", v)
		}
		b.WriteString(printable(k) + "=" + v)
	}
	return b.String()
}

func truncate(s string, n int) string {
	s = oneLine(s)
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// heldBy says who holds a name, for the waiting line and messages:
// "host-a pid 4242 (running 3m12s, expires in 12s)".
func heldBy(info *dlock.Info, now time.Time) string {
	hs := info.Holders
	switch len(hs) {
	case 0:
		return "nobody (it was just released)"
	case 1:
		h := hs[0]
		who := whoHolds(h)
		switch holderMode(info, h) {
		case "read":
			who = "a reader, " + who
		case "write":
			who = "a writer, " + who
		}
		if released(info, h) {
			return fmt.Sprintf("%s, whose run ended; kept for its minimum hold (started %s ago, free in %s)", who, fmtDur(age(h, now)), fmtDur(h.TTL))
		}
		return fmt.Sprintf("%s (running %s, expires in %s)", who, fmtDur(age(h, now)), fmtDur(h.TTL))
	}
	oldest, soonest := hs[0], hs[0]
	for _, h := range hs[1:] {
		if h.Since.Before(oldest.Since) {
			oldest = h
		}
		if h.TTL < soonest.TTL {
			soonest = h
		}
	}
	return fmt.Sprintf("%s (the oldest running %s, the next expiring in %s)", countHolders(info), fmtDur(age(oldest, now)), fmtDur(soonest.TTL))
}

// countHolders says how many hold a name: "3 readers", "2 of 5 permits".
func countHolders(info *dlock.Info) string {
	if n, ok := permits(info); ok {
		return fmt.Sprintf("%d of %d permits", len(info.Holders), n)
	}
	readers := countReaders(info)
	if readers == len(info.Holders) {
		return plural(readers, "reader")
	}
	return plural(len(info.Holders), "holder")
}

func countReaders(info *dlock.Info) int {
	n := 0
	for _, h := range info.Holders {
		if holderMode(info, h) == "read" {
			n++
		}
	}
	return n
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// released reports whether h is an exclusive lock's hold released before
// its minimum hold had passed (dlock.WithMinHold, run --min-hold): kept,
// with no acquisition left, until it runs out.
func released(info *dlock.Info, h dlock.Holder) bool {
	return info.Kind == dlock.KindLock && h.Count == 0
}

// age is how long h has held its name, by the local clock.
func age(h dlock.Holder, now time.Time) time.Duration {
	return max(now.Sub(h.Since), 0)
}

// fmtDur writes a duration for people: "450ms", "1.6s", "12s", "3m12s", "3m",
// "2h5m", "3h". From an hour up it counts minutes, and hours however many
// (the longest duration is "2562047h47m").
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < 10*time.Second: // "1.6s", not "2s"
		return d.Round(100 * time.Millisecond).String()
	case d.Round(time.Second) < time.Minute: // 59.7s is "1m", not "1m0s"
		return d.Round(time.Second).String()
	case d.Round(time.Second) < time.Hour:
		s := d.Round(time.Second).String() // "3m12s", "3m0s"
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		return s
	default:
		s := strings.TrimSuffix(d.Round(time.Minute).String(), "0s") // "2h5m", "3h0m"
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	}
}

func kindName(info *dlock.Info) string {
	if info.Kind == dlock.KindNone {
		return "free"
	}
	return string(info.Kind)
}

// infoJSON is the JSON form of an inspection record, for status, ls and
// release with --json.
type infoJSON struct {
	Name          string       `json:"name"`
	NameBase64    string       `json:"name_base64,omitempty"` // the name's bytes, when they are not UTF-8 (Name then shows U+FFFD for the others)
	Kind          string       `json:"kind"`                  // "free" when nobody holds it
	Held          bool         `json:"held"`
	Fence         uint64       `json:"fence"`                   // the newest fence issued for the name
	FenceForeign  bool         `json:"fence_foreign,omitempty"` // status: the name's fence counter holds data dlock did not write (fence is then 0)
	Holders       []holderJSON `json:"holders"`
	Readers       int          `json:"readers"`
	Waiters       *int         `json:"waiters,omitempty"`
	WriterWaiting *bool        `json:"writer_waiting,omitempty"`
	Fair          *bool        `json:"fair,omitempty"` // read/write locks: served in arrival order
	Permits       *int         `json:"permits,omitempty"`
}

type holderJSON struct {
	Mode     string            `json:"mode"` // exclusive, write, read or permit
	Owner    string            `json:"owner,omitempty"`
	Count    int               `json:"count"`
	Released bool              `json:"released,omitempty"` // released before its minimum hold, kept until ttl_ms runs out
	Metadata string            `json:"metadata"`
	Meta     map[string]string `json:"meta,omitempty"` // the metadata, when it is a JSON object
	Since    time.Time         `json:"since"`
	AgeMS    int64             `json:"age_ms"`
	TTLMS    int64             `json:"ttl_ms"`
	Fence    uint64            `json:"fence"`
}

func toJSON(info *dlock.Info, now time.Time) infoJSON {
	out := infoJSON{
		Name: info.Name, Kind: kindName(info), Held: len(info.Holders) > 0,
		Fence: info.Fence, Holders: []holderJSON{}, Readers: countReaders(info),
	}
	if !utf8.ValidString(info.Name) {
		out.NameBase64 = base64.StdEncoding.EncodeToString([]byte(info.Name))
	}
	for _, h := range info.Holders {
		out.Holders = append(out.Holders, holderJSON{
			Mode: holderMode(info, h), Owner: h.Owner, Count: h.Count, Released: released(info, h),
			Metadata: h.Metadata, Meta: parseMeta(h.Metadata),
			Since: h.Since.UTC(), AgeMS: age(h, now).Milliseconds(), TTLMS: h.TTL.Milliseconds(), Fence: h.Fence,
		})
	}
	if n, ok := waiters(info); ok {
		out.Waiters = &n
	}
	if w, ok := writerWaiting(info); ok {
		out.WriterWaiting = &w
	}
	if f, ok := fair(info); ok {
		out.Fair = &f
	}
	if n, ok := permits(info); ok {
		out.Permits = &n
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// marshal is json.Marshal without its HTML escapes (& as \u0026): the
// text is for terminals, scripts and redis-cli, not for HTML.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// writeStatus writes the inspection record of one name for people.
// badFence is the key of the name's fence counter when it holds data dlock
// did not write, "" otherwise.
func writeStatus(w io.Writer, info *dlock.Info, now time.Time, badFence string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", printable(info.Name))
	if f, _ := fair(info); f {
		fmt.Fprintf(tw, "kind:\t%s (fair: readers and writers in arrival order)\n", kindName(info))
	} else {
		fmt.Fprintf(tw, "kind:\t%s\n", kindName(info))
	}
	if len(info.Holders) == 0 {
		fmt.Fprintf(tw, "held by:\tnobody\n")
	} else {
		fmt.Fprintf(tw, "held by:\t%s\n", heldBy(info, now))
	}
	if n, ok := permits(info); ok {
		fmt.Fprintf(tw, "permits:\t%d of %d in use\n", len(info.Holders), n)
	} else if r := countReaders(info); r > 0 {
		fmt.Fprintf(tw, "readers:\t%d\n", r)
	}
	if n, ok := waiters(info); ok {
		fmt.Fprintf(tw, "waiters:\t%d\n", n)
	}
	if ww, ok := writerWaiting(info); ok && ww {
		fmt.Fprintf(tw, "writer waiting:\tyes\n")
	}
	switch {
	case info.Kind == dlock.KindSemaphore:
		fmt.Fprintf(tw, "fence:\tnone (a semaphore's permits have no fence)\n")
	case badFence != "":
		fmt.Fprintf(tw, "fence:\tunknown: its counter %q holds data dlock did not write (a plain or --write run of the name is refused)\n", badFence)
	case info.Fence == 0:
		fmt.Fprintf(tw, "fence:\t0 (none recorded)\n")
	default:
		fmt.Fprintf(tw, "fence:\t%d (the newest issued)\n", info.Fence)
	}
	tw.Flush()
	for i, h := range info.Holders {
		fmt.Fprintf(w, "\nholder %d: %s\n", i+1, whoHolds(h))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if info.Kind != dlock.KindLock {
			fmt.Fprintf(tw, "  mode:\t%s\n", holderMode(info, h))
		}
		m := parseMeta(h.Metadata)
		if m[metaUser] != "" {
			fmt.Fprintf(tw, "  user:\t%s\n", printable(m[metaUser]))
		}
		if m[metaCmd] != "" {
			fmt.Fprintf(tw, "  command:\t%s\n", oneLine(m[metaCmd]))
		}
		if released(info, h) {
			fmt.Fprintf(tw, "  since:\t%s (%s ago; released)\n", h.Since.UTC().Format("2006-01-02 15:04:05 MST"), fmtDur(age(h, now)))
			fmt.Fprintf(tw, "  expires:\tin %s, kept until then for its minimum hold\n", fmtDur(h.TTL))
		} else {
			fmt.Fprintf(tw, "  since:\t%s (running %s)\n", h.Since.UTC().Format("2006-01-02 15:04:05 MST"), fmtDur(age(h, now)))
			fmt.Fprintf(tw, "  expires:\tin %s unless refreshed\n", fmtDur(h.TTL))
		}
		fmt.Fprintf(tw, "  fence:\t%d\n", h.Fence)
		if h.Owner != "" {
			fmt.Fprintf(tw, "  owner:\t%s (held %s)\n", printable(h.Owner), plural(h.Count, "time"))
		}
		switch {
		case m == nil && h.Metadata != "":
			fmt.Fprintf(tw, "  metadata:\t%s\n", oneLine(h.Metadata))
		case m != nil:
			if extra := formatExtra(m, map[string]bool{metaHost: true, metaPID: true, metaUser: true, metaCmd: true}); extra != "" {
				fmt.Fprintf(tw, "  metadata:\t%s\n", extra)
			}
		}
		tw.Flush()
	}
}

// tableLines renders ls's table, one string per line.
func tableLines(infos []*dlock.Info, now time.Time) []string {
	showWaiters := false
	for _, info := range infos {
		if _, ok := waiters(info); ok {
			showWaiters = true
		}
	}
	header := []string{"NAME", "KIND", "HELD BY", "RUNNING", "EXPIRES", "FENCE"}
	if showWaiters {
		header = append(header, "WAITERS")
	}
	rows := [][]string{header}
	for _, info := range infos {
		who, running, expires := "-", "-", "-"
		if hs := info.Holders; len(hs) == 1 {
			who = whoHolds(hs[0])
			running, expires = fmtDur(age(hs[0], now)), fmtDur(hs[0].TTL)
			if released(info, hs[0]) {
				running = "ended"
			}
		} else if len(hs) > 1 {
			who = countHolders(info)
			oldest, soonest := hs[0], hs[0]
			for _, h := range hs[1:] {
				if h.Since.Before(oldest.Since) {
					oldest = h
				}
				if h.TTL < soonest.TTL {
					soonest = h
				}
			}
			running, expires = fmtDur(age(oldest, now)), fmtDur(soonest.TTL)
		}
		row := []string{printable(info.Name), kindName(info), who, running, expires, strconv.FormatUint(info.Fence, 10)}
		if showWaiters {
			n, _ := waiters(info)
			row = append(row, strconv.Itoa(n))
		}
		rows = append(rows, row)
	}
	return columns(rows)
}
