package keyslot

import "testing"

// TestOf compares with the answers of CLUSTER KEYSLOT on redis-server 7.0.
func TestOf(t *testing.T) {
	for key, want := range map[string]int{
		"":                     0,
		"a":                    15495,
		"foo":                  12182,
		"bar":                  5061,
		"hello":                866,
		"123456789":            12739, // CRC16/XMODEM check value 0x31C3
		"{user1000}.following": 3443,
		"foo{}{bar}":           8363,  // an empty tag counts for nothing: the whole key
		"foo{{bar}}zap":        4015,  // the tag is "{bar"
		"foo{bar}{zap}":        5061,  // the first tag only: "bar"
		"dlock:{orders:42}":    11414, // as dlock names a lock's key
		"{}x":                  10595,
		"x{}{y}":               14166,
		"\xff":                 7920,
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
}
