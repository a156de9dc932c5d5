package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// reply is one decoded RESP reply.
type reply struct {
	kind  byte   // RESP type byte: '+', '-', ':', '$', '*', and RESP3 types
	str   string // simple string, error, bulk string, integer/double/bool text
	null  bool   // nil bulk string, nil array or RESP3 null
	elems []reply
}

// errorReply is an error reply ("-ERR ...") from the server.
type errorReply string

func (e errorReply) Error() string { return string(e) }

// text renders the reply as Do documents it.
func (r reply) text() string {
	if r.null {
		return "(nil)"
	}
	switch r.kind {
	case '*', '~', '>', '%':
		lines := make([]string, 0, len(r.elems))
		for _, e := range r.elems {
			lines = append(lines, e.text())
		}
		return strings.Join(lines, "\n")
	default:
		return r.str
	}
}

// fields returns a flat key/value array reply (as SENTINEL MASTER answers) as
// a map.
func (r reply) fields() map[string]string {
	m := make(map[string]string, len(r.elems)/2)
	for i := 0; i+1 < len(r.elems); i += 2 {
		m[r.elems[i].text()] = r.elems[i+1].text()
	}
	return m
}

// command opens a connection to addr (over TLS when tlsConf is set), sends one command and reads its reply.
// The whole exchange is bounded by timeout. An error reply is returned as an
// errorReply error.
func command(addr string, tlsConf *tls.Config, timeout time.Duration, args ...string) (reply, error) {
	r, err := pipeline(addr, tlsConf, timeout, args)
	if len(r) == 0 {
		return reply{}, err
	}
	return r[0], err
}

// pipeline is command for several commands, sent at once on one
// connection: the server runs them one after the other, with nothing of
// another client's in between. It returns the replies up to the first
// error, with that error.
func pipeline(addr string, tlsConf *tls.Config, timeout time.Duration, cmds ...[]string) ([]reply, error) {
	if len(cmds) == 0 || slices.ContainsFunc(cmds, func(args []string) bool { return len(args) == 0 }) {
		return nil, errors.New("empty command")
	}
	var conn net.Conn
	var err error
	if tlsConf != nil {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", addr, tlsConf)
	} else {
		conn, err = net.DialTimeout("tcp", addr, timeout)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var out []byte
	for _, args := range cmds {
		out = append(out, encodeCommand(args)...)
	}
	if _, err := conn.Write(out); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	var replies []reply
	for range cmds {
		r, err := readReply(br)
		if err != nil {
			return replies, err
		}
		replies = append(replies, r)
		if r.kind == '-' || r.kind == '!' {
			return replies, errorReply(r.str)
		}
	}
	return replies, nil
}

// encodeCommand encodes args as a RESP array of bulk strings.
func encodeCommand(args []string) []byte {
	var b []byte
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// readLine reads one CRLF-terminated line without the CRLF.
func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(line, "\r\n") {
		return "", fmt.Errorf("malformed RESP line %q", line)
	}
	return line[:len(line)-2], nil
}

// readReply reads one RESP2 or RESP3 reply.
func readReply(br *bufio.Reader) (reply, error) {
	line, err := readLine(br)
	if err != nil {
		return reply{}, err
	}
	if line == "" {
		return reply{}, errors.New("empty RESP line")
	}
	kind, rest := line[0], line[1:]
	switch kind {
	case '+', '-', ':', ',', '(':
		return reply{kind: kind, str: rest}, nil
	case '#':
		if rest == "t" {
			return reply{kind: kind, str: "true"}, nil
		}
		return reply{kind: kind, str: "false"}, nil
	case '_':
		return reply{kind: kind, null: true}, nil
	case '$', '!', '=':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return reply{}, fmt.Errorf("bad RESP length %q", line)
		}
		if n < 0 {
			return reply{kind: kind, null: true}, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return reply{}, err
		}
		s := string(buf[:n])
		if kind == '=' && len(s) >= 4 && s[3] == ':' {
			s = s[4:] // verbatim string: drop the "txt:" format prefix
		}
		return reply{kind: kind, str: s}, nil
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return reply{}, fmt.Errorf("bad RESP length %q", line)
		}
		if n < 0 {
			return reply{kind: kind, null: true}, nil
		}
		if kind == '%' || kind == '|' {
			n *= 2
		}
		elems := make([]reply, 0, n)
		for range n {
			e, err := readReply(br)
			if err != nil {
				return reply{}, err
			}
			elems = append(elems, e)
		}
		if kind == '|' {
			// An attribute precedes the actual reply; skip it.
			return readReply(br)
		}
		return reply{kind: kind, elems: elems}, nil
	default:
		return reply{}, fmt.Errorf("unknown RESP type in %q", line)
	}
}

// infoField returns the value of key in an INFO reply, and whether it is
// present.
func infoField(info, key string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimRight(line, "\r")
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return v, true
		}
	}
	return "", false
}
