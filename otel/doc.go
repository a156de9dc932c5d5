// Package dlockotel records what the locks of a dlock.Client do as
// OpenTelemetry metrics and spans, through the client's hooks:
//
//	h, err := dlockotel.Hooks()
//	if err != nil {
//		return err
//	}
//	locks := dlock.New(driver, dlock.WithHooks(h))
//
// By default the hooks use the global meter and tracer providers; set
// others with WithMeterProvider and WithTracerProvider. The package uses
// the OpenTelemetry API only: the application chooses the SDK and the
// exporters (Prometheus, OTLP, …).
//
// # Metrics
//
// Every metric has the attribute dlock.lock.mode (exclusive, read, write
// or permit); lock names are left out, as a time series per name would
// grow without bound.
//
//	dlock.acquire.duration  histogram, s   wait from the start of an acquisition to its outcome
//	dlock.acquisitions      counter        acquisitions that ended, by dlock.acquire.outcome
//	dlock.acquire.retries   counter        failed attempts of waiting acquisitions (the last before giving up too, but not a refusal for good)
//	dlock.refreshes         counter        refreshes, by dlock.refresh.outcome
//	dlock.hold.duration     histogram, s   how long locks were held, at release, loss or max hold (dlock.hold.end)
//	dlock.held_locks        up-down        locks held now
//	dlock.lost_locks        counter        locks lost (not those that ended at their WithMaxHold)
//
// The README of this module lists their units and attributes.
//
// # Spans
//
// A dlock.acquire span covers each acquisition (Lock, TryLock, RLock,
// Acquire, …) and a dlock.release span each Release. Both are children of
// the span in the context given to the call, carry the lock names
// (dlock.lock.names) and mode, and are the parents of the spans of the
// Redis requests they make if the Redis client is instrumented too (a
// pipeline that carries the requests of several callers, under load, is
// the first one's child). An
// acquisition that fails with an error (not merely refused) has status
// Error; so has a release that fails or finds the lock lost. Each retry of
// a waiting acquisition is an event, dlock.retry, on its span.
package dlockotel
