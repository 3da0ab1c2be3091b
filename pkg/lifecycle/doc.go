// Package lifecycle is the in-process lifecycle event bus and the
// layer0.lifecycle.v1.LifecycleService server on top of it. The
// orchestrator owns one Bus, publishes its own budget, compaction and
// observable events on it, and registers NewServer(bus) so that other
// processes can subscribe and publish over gRPC.
//
// The bus, in four properties:
//
//   - Sequences. Publish gives every event the next sequence, strictly
//     increasing from Options.StartSequence+1, and the current time when
//     the publisher left it unset. A caller that persists LastSequence and
//     passes it back as StartSequence keeps sequences increasing across
//     restarts.
//   - A bounded ring. The last Options.BufferSize events (4096 by
//     default) are kept, in a slice allocated once, for replay. Memory is
//     bounded by the number of events, not their size.
//   - Non-blocking fan-out. Publish hands each event to the matching
//     subscribers with a non-blocking send on a channel of
//     Options.SubscriberBuffer deliveries (256 by default). A subscriber
//     whose channel is full misses the event; its dropped counter grows and
//     the count is reported with its next delivery (Delivery.Dropped,
//     SubscribeResponse.dropped). A slow or stuck subscriber therefore
//     never slows a publisher, and the bus starts no goroutines.
//   - Replay. Subscribe with an after sequence first receives the buffered
//     events after it that match the filter, in order, then live events,
//     with no gap and no duplicate: replay and registration happen under
//     the lock Publish takes. When events after that sequence were already
//     evicted from the ring, Subscribe fails with OUT_OF_RANGE naming the
//     oldest sequence kept, so the subscriber knows it lost events rather
//     than silently missing them.
//
// Delivered events are shared by every subscriber and the ring: treat them
// as read-only. Publish stores a clone, so the publisher may reuse its
// message.
//
// Server adapts the bus to gRPC: Subscribe streams SubscribeResponse
// messages until the client leaves (CANCELED), the bus closes or the
// server shuts down (UNAVAILABLE); Publish assigns a sequence to an event
// sent by another process. Errors wrap pkg/errs kinds; the interceptor
// chain of pkg/grpcserver turns them into statuses.
package lifecycle
