// Package keyslot computes Redis Cluster hash slots, as the server does, for
// the parts of dlock that group keys by slot.
package keyslot

import "strings"

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// Tag returns the part of key that places it: its hash tag (the text
// between its first '{' and the next '}', when not empty), or the whole key
// if it has none. Redis Cluster and go-redis's Ring both place keys by it.
func Tag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// Of returns the Redis Cluster hash slot of key: the CRC16 (XMODEM) of its
// Tag, modulo 16384.
func Of(key string) int {
	key = Tag(key)
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % Slots)
}
