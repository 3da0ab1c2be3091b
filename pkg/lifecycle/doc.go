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
//     subscribers with a non-blocking send on a channel that holds at most
//     Options.SubscriberBuffer live events (256 by default) of at most
//     Options.SubscriberBufferBytes in all (their encoded size; 256 KiB by
//     default; one larger event still fits an empty channel). An event
//     that does not fit is missed: the subscriber's dropped counter grows
//     and the count is reported with its next delivery (Delivery.Dropped).
//     A subscriber made with UntilFull is ended instead, keeping the
//     contiguous events it holds, so that it can resume with no gap (see
//     Server). A slow or stuck subscriber therefore never slows a
//     publisher, nor pins more than its bound, and the bus starts no
//     goroutines.
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
// message; PublishOwned stores the message itself, for a publisher that
// is done with it (the orchestrator's journal engine, which publishes
// every event of every workflow). Marshal encodes an event as
// proto.Marshal does, faster for observable data (marshal.go).
//
// Server adapts the bus to gRPC: Subscribe streams SubscribeResponse
// messages until the client leaves (CANCELED), the bus closes or the
// server shuts down (UNAVAILABLE); Publish assigns a sequence to an event
// sent by another process. Errors wrap pkg/errs kinds; the interceptor
// chain of pkg/grpcserver turns them into statuses.
//
// What Subscribe streams may cost the server is bounded (limits.go,
// sender.go):
//
//   - Caps. At most WithStreamLimits streams are open at once, in all
//     (DefaultMaxStreams, 1024) and per client (DefaultMaxStreamsPerClient,
//     64), a client being its authenticated principal, else its IP address.
//     A stream over a cap is refused at once: RESOURCE_EXHAUSTED naming the
//     cap, its value and its flag.
//   - A subscriber that does not keep up is ended. The server subscribes
//     with UntilFull: once an event does not fit the subscriber's buffer,
//     the stream ends with RESOURCE_EXHAUSTED ("the subscriber did not keep
//     up: N events (M KiB) were waiting ...; resubscribe with
//     after_sequence=S to resume"). The events it received are contiguous
//     and S is the last of them, so resubscribing with after_sequence=S
//     replays the rest from the ring with no gap and no duplicate, or
//     fails with OUT_OF_RANGE if the ring no longer holds them. A stream
//     never reports dropped events: it ends instead.
//   - A client that does not read is ended. Events are sent from a
//     goroutine of their own, so the handler can end the stream while a
//     Send is blocked by HTTP/2 flow control: when the buffer overflows,
//     or when a Send has waited WithSendTimeout (DefaultSendTimeout, a
//     minute). Ending the stream makes gRPC cancel it, which unblocks the
//     Send.
//   - gRPC's own send queue. Until the client reads, gRPC keeps up to its
//     per-stream write quota (64 KiB of messages, plus the one that goes
//     over it) queued for a stream, also after the stream ended (until
//     the client reads or its connection closes; such a stream no longer
//     counts towards the caps, only towards its connection's
//     MaxConcurrentStreams). Each
//     message is encoded into a buffer of its own size (grpc.PreparedMsg)
//     rather than a pooled one, which gRPC rounds up to 4 KiB, 16 KiB,
//     32 KiB or 1 MiB: that queue pins the events' size, not up to 32
//     times it.
//
// So a stream costs at most its subscriber buffer (SubscriberBufferBytes
// of events the ring may no longer hold), 64 KiB of queued messages with
// gRPC's bookkeeping of about 350 B each, two events more (one over the
// quota, one in a blocked Send), and about 23 KiB of goroutines and gRPC
// state. Measured per stream that does not read (memory_test.go, heap in
// use): about 90 KiB with 4.5 KiB events, 210 KiB with 160 B events.
// Subscribe sends its response headers once the stream is subscribed, so
// a client can tell a live subscription from one still being set up.
package lifecycle
