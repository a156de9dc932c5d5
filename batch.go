package dlock

import (
	"context"
	"sync"
	"time"
)

// batcher coalesces the script calls that many goroutines issue at once
// into pipelines. While fewer than max pipelines are in flight a call goes
// out at once, alone, with no added delay. Beyond that, calls queue; when a
// pipeline returns, the goroutine that sent it hands everything queued
// meanwhile to the first queued caller, which sends it as one pipeline. So
// under load each round trip carries many calls, and no goroutine is
// started: every call is sent by a goroutine that waits for it.
type batcher struct {
	driver Driver
	max    int
	lib    *Library // set by WithFunctions

	mu       sync.Mutex
	inflight int
	queue    []*queued
}

// queued is a call waiting for a pipeline.
type queued struct {
	ctx  context.Context
	call *Call
	done chan struct{}  // closed when the call has its reply
	lead chan []*queued // receives a batch for this caller to send
}

// DefaultPipelines is how many pipelines a client keeps in flight at once
// before it queues calls to coalesce them (see WithPipelines).
const DefaultPipelines = 4

func (b *batcher) eval(ctx context.Context, call *Call) {
	b.made()
	b.mu.Lock()
	if b.inflight < b.max {
		b.inflight++
		b.mu.Unlock()
		b.run(ctx, call.one()...)
		b.handOver()
		return
	}
	q := &queued{ctx: ctx, call: call, done: make(chan struct{}), lead: make(chan []*queued, 1)}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
	case batch := <-q.lead:
		b.send(batch)
	case <-ctx.Done():
		if b.withdraw(q) {
			call.Err = ctx.Err()
			return
		}
		// Already taken into a batch: wait for it like the rest.
		select {
		case <-q.done:
		case batch := <-q.lead:
			b.send(batch)
		}
	}
}

// made panics unless New made the batcher's Client: the zero batcher
// would queue every call for ever, with no pipeline ever in flight to send
// it.
func (b *batcher) made() {
	if b.driver == nil {
		panic(notNew)
	}
}

// run hands calls to the driver at once: by FCALL with WithFunctions.
func (b *batcher) run(ctx context.Context, calls ...*Call) {
	b.made()
	b.mark(calls)
	b.driver.Eval(ctx, calls...)
	b.check(calls)
}

// mark sets the function library on calls, with WithFunctions.
func (b *batcher) mark(calls []*Call) {
	if b.lib == nil {
		return
	}
	for _, c := range calls {
		c.Lib = b.lib
	}
}

// check turns the replies of a server without functions into
// ErrNoFunctions, with WithFunctions, and Redis's protocol error for a
// client that has not authenticated into one that says so (see
// unauthenticated).
func (b *batcher) check(calls []*Call) {
	for _, c := range calls {
		switch {
		case c.Err == nil:
		case isUnauthenticated(c.Err):
			c.Err = &unauthenticated{c.Err}
		case b.lib != nil:
			c.Err = functionsError(c.Err)
		}
	}
}

// send sends a batch led by its first caller, hands on the queue, and
// wakes the other callers.
func (b *batcher) send(batch []*queued) {
	calls := make([]*Call, len(batch))
	for i, q := range batch {
		calls[i] = q.call
	}
	ctx, cancel := batchContext(batch)
	b.run(ctx, calls...)
	cancel()
	for _, q := range batch[1:] {
		close(q.done)
	}
	b.handOver()
}

// handOver gives whatever queued while a pipeline was out to the first
// queued caller, or frees the pipeline's slot.
func (b *batcher) handOver() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	batch := b.queue
	b.queue = nil
	b.mu.Unlock()
	batch[0].lead <- batch
}

// withdraw takes a caller whose context ended out of the queue, and
// reports whether it was still there.
func (b *batcher) withdraw(q *queued) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.queue {
		if x == q {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return true
		}
	}
	return false
}

// batchContext is the context a pipeline is sent under: it ends at the
// latest deadline of its callers (none if any has none), and is not
// cancelled when one caller gives up, so the others still get replies.
func batchContext(batch []*queued) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, q := range batch {
		d, ok := q.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(batch[0].ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}
