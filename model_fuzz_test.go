package dlock_test

import (
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
)

// FuzzModel drives the model-based test of read/write locks and semaphores
// (model_test.go) with the fuzzer's bytes: each byte is one choice of the
// next operation and its arguments, so the fuzzer explores sequences of
// acquires, waits, releases, refreshes, expiries, forced releases and
// permit changes, and every result is compared with the model. The first
// byte picks the primitive: a read/write lock, a fair one, or a semaphore.
// One Redis serves every input, each on a name of its own.
func FuzzModel(f *testing.F) {
	f.Add([]byte{0, 165, 77, 202, 24, 37, 48, 187, 29, 109, 19, 44, 222, 214, 35, 123, 46, 217, 30, 63, 114, 31, 203, 25, 113, 23, 68, 148, 214, 73, 60, 157, 92, 52, 96, 190, 49, 32, 30, 105, 254, 218, 160, 238, 232, 185, 153, 127, 92, 124, 41, 153, 253, 175, 229, 147, 37, 60, 214, 84, 175, 77, 250, 215, 20, 39, 160, 174, 179, 254, 233, 35, 47, 138, 242, 33, 31, 158, 228, 145, 197, 177, 11, 236, 181, 86, 59, 252, 30, 111, 147})
	f.Add([]byte{1, 66, 126, 203, 200, 254, 41, 85, 229, 205, 142, 70, 220, 142, 212, 183, 194, 118, 77, 42, 90, 77, 118, 119, 6, 248, 93, 134, 144, 2, 74, 214, 189, 163, 64, 27, 233, 200, 203, 204, 201, 53, 246, 205, 31, 97, 34, 106, 225, 83, 56, 174, 26, 52, 0, 77, 51, 186, 13, 36, 106, 192, 76, 129, 177, 186, 242, 62, 59, 249, 238, 245, 247, 159, 43, 73, 52, 175, 135, 245, 82, 11, 105, 185, 75, 13, 152, 46, 133, 187, 85})
	f.Add([]byte{2, 182, 114, 168, 114, 99, 122, 205, 116, 102, 252, 182, 14, 14, 143, 241, 132, 99, 176, 228, 178, 186, 41, 112, 52, 116, 240, 100, 172, 104, 247, 0, 245, 176, 43, 61, 198, 102, 244, 91, 222, 170, 44, 202, 237, 205, 43, 81, 87, 65, 14, 77, 238, 74, 242, 179, 79, 67, 10, 7, 52, 71, 222, 99, 108, 14, 128, 108, 149, 123, 166, 132, 214, 67, 31, 181, 234, 215, 66, 77, 9, 225, 93, 2, 76, 88, 72, 242, 61, 31, 166})
	e := newEnv(f)
	var inputs atomic.Int64
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		kind, fair := modelRW, data[0]%3 == 1
		if data[0]%3 == 2 {
			kind = modelSem
		}
		src := &byteSource{data: data[1:]}
		steps := min(len(data)/3+1, 150)
		runModelOn(t, e, kind, fair, src, "fuzz-"+strconv.FormatInt(inputs.Add(1), 10), steps)
	})
}

// byteSource is a rand.Source that turns each byte into one draw: byte b
// is the fraction b/256 of the range, so rand.IntN(n) returns about
// b*n/256. Once the bytes run out, it draws from a fixed-seed generator (a
// constant source would make rand's rejection sampling spin).
type byteSource struct {
	data []byte
	rest *rand.PCG
}

func (s *byteSource) Uint64() uint64 {
	if len(s.data) == 0 {
		if s.rest == nil {
			s.rest = rand.NewPCG(1, 2)
		}
		return s.rest.Uint64()
	}
	b := uint64(s.data[0])
	s.data = s.data[1:]
	return b<<56 | b*0x01010101010101
}
