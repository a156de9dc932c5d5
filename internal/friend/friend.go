// Package friend carries what package dlock lets its own other packages
// use, and nobody else.
package friend

// OneUseToken, set by package dlock, returns a dlock.Option (as any) that
// gives an acquisition its token, as dlock.WithToken does, for that one
// acquisition only: dlock treats it as a token it made itself, so the
// acquisition's release or clean-up records its end, and a late copy of
// its acquire takes nothing. Package redlock takes each node with it: one
// token for every node of an attempt, never used again.
var OneUseToken func(token string) any
