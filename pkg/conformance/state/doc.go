// Package state is the conformance suite of layer0.state.v1.StateService
// (proto/layer0/state/v1/state.proto): a Go test suite that checks any
// implementation, in any language, over gRPC at an address.
//
// # Running it against a server
//
//	go test ./pkg/conformance/state -v -args -addr HOST:PORT \
//	    [-token-file F] [-readonly-token-file F] \
//	    [-max-key-bytes N -max-value-bytes N] [-tls] [-ca F] [-server-name NAME]
//
// With -addr the suite runs only against that server. Without it, the
// test starts the reference service (services/state) in process on
// loopback through pkg/grpcserver's standard chain, once over bbolt (in a
// temporary directory) and once over the in-memory backend, and runs the
// whole suite against each: a dev-mode server takes the suite's calls and
// a second server on the same store, with an auth policy of a writer and
// a read-only operator, takes the access checks. The in-process servers
// run with limits of 1024 key bytes and 65536 value bytes (the limit flags
// apply only with -addr). Add -count=1 to rerun without -addr, which go
// test otherwise caches. Flags:
//
//	-addr                 the server; plaintext unless -tls or -ca is given
//	-token-file           file holding a bearer token allowed every method
//	                      (omit for a server with authentication off)
//	-readonly-token-file  file holding a bearer token allowed only Read, List
//	                      and Search; without it the read-only checks skip
//	-max-key-bytes        the server's key limit (default 4096)
//	-max-value-bytes      the server's value limit (default 1048576)
//	-tls, -ca, -server-name  TLS to the server, with an optional CA bundle
//
// The suite writes under a random namespace per run (scope ids and global
// keys start with "conf" and 12 hex digits), so it can run against a
// server that already holds data, and repeatedly. It never deletes keys it
// did not write. Global-scope keys and the custom scopes named "global"
// and "session" are shared with other users; everything else is in fresh
// scopes.
//
// # What the server must be configured with
//
//   - The limits given by -max-key-bytes and -max-value-bytes (at least 64
//     key bytes and 4096 value bytes). The key limit counts UTF-8 bytes of the key; the value
//     limit is checked with values clearly under (half) and over (by 64
//     bytes of JSON) it, so counting JSON or protobuf bytes both pass.
//   - grpc.health.v1 Health, reporting "" and "layer0.state.v1.StateService"
//     as SERVING.
//   - For the access checks, authentication with two bearer tokens
//     ("authorization: Bearer <token>", trailing whitespace of the token
//     files is trimmed): one allowed every method, one
//     allowed only Read, List and Search on the same store. With a token
//     file given, calls without a token or with an unknown one must be
//     UNAUTHENTICATED.
//
// For example, with the reference service, a policy.json of
//
//	{"principals": [
//	  {"name": "orchestrator", "tokens": ["<writer token>"], "allow": ["*"]},
//	  {"name": "operator", "tokens": ["<reader token>"], "allow": [
//	    "/layer0.state.v1.StateService/Read",
//	    "/layer0.state.v1.StateService/List",
//	    "/layer0.state.v1.StateService/Search"]}]}
//
// and the two tokens in writer.tok and reader.tok:
//
//	go run ./services/state/cmd/state --plaintext --auth-policy policy.json \
//	    --backend memory --addr 127.0.0.1:7072 --max-key-bytes 1024 --max-value-bytes 65536
//	go test ./pkg/conformance/state -args -addr 127.0.0.1:7072 \
//	    -token-file writer.tok -readonly-token-file reader.tok \
//	    -max-key-bytes 1024 -max-value-bytes 65536
//
// or, with authentication off, --dev instead of --plaintext --auth-policy
// and no token files.
//
// # What it checks
//
// Each behaviour is its own subtest, named after it (run one with
// -run 'TestConformance/.*/List/TamperedPageToken'); codes are checked
// exactly, and where the contract names a reason, so is the
// google.rpc.ErrorInfo in the status details, which must have domain
// "layer0.neuron.dev" (pkg/errs):
//
//   - Scopes: each kind (session, workflow, agent, global, custom) does
//     Read/Write/List/Search/Delete; scopes never see each other's keys,
//     whatever the keys and scope ids contain ("..", "/", NUL, unicode in
//     two normal forms, keys at the size limit), including an agent scope
//     vs the workflow scope with the same id, and a custom scope named
//     like a session id.
//   - Revisions: NOT_FOUND for a missing key; every write returns a
//     strictly greater revision that Read and List return; a stale
//     expected_revision is FAILED_PRECONDITION / STALE_REVISION and changes
//     nothing; expected_revision 0 means "must not exist"; Delete of a
//     missing key is a no-op (existed = false); a revision after delete and
//     re-create is greater than before.
//   - Idempotency: a retried Write or Delete with the same idempotency_key
//     returns the first result with replayed = true and is not applied
//     again, even with another value or after a later write; keys are per
//     scope.
//   - List: prefixes, byte order, paging with page_size (each key once, in
//     order, also while keys are added and removed between pages), the
//     default page size of 100; INVALID_ARGUMENT for page tokens of another
//     scope or prefix or altered ones, and page_size outside 0..1000.
//   - ListValues: with include_values every item carries its current
//     value (and none without it); reverse lists in descending byte
//     order, within the prefix and scope, page by page; a page token
//     works only in the direction it was issued for (else
//     INVALID_ARGUMENT); pages with values keep to 2 MiB of keys and
//     encoded values unless they hold one item, and still list every key
//     once. A server with a store middleware, which returns no values,
//     fails these checks.
//   - Search: words in nested JSON strings, more occurrences rank higher,
//     snippets contain the term, limit (default 10), scope isolation,
//     read-your-writes, deleted and overwritten values are gone;
//     INVALID_ARGUMENT for an empty query or a limit outside 0..1000.
//   - Retention (only with Target.RetentionMaxEntries, the N of the
//     server's rule scope=custom,prefix=retained/,max-entries=N): the N
//     newest keys of the prefix stay, the others go (waiting up to 30 s
//     for the sweeper), keys outside the prefix stay, and keyword and
//     vector search no longer find the removed keys.
//   - Limits: a key over the limit is INVALID_ARGUMENT and a value over it
//     RESOURCE_EXHAUSTED / LIMIT_EXCEEDED, both with a message naming the
//     limit's number; missing scope, scope without kind, empty ids or keys
//     are INVALID_ARGUMENT.
//   - Access: the read-only credential can Read, List and Search but gets
//     PERMISSION_DENIED for Write and Delete; no token or an unknown token
//     is UNAUTHENTICATED.
//   - Health, and concurrency: compare-and-set increments from several
//     goroutines lose no update, and of concurrent "must not exist" writes
//     exactly one wins.
//
// # Reusing it
//
// Another Go test can run the suite against its own server:
//
//	func TestMyStateService(t *testing.T) {
//		conn := ... // a *grpc.ClientConn to the server
//		state.Run(t, state.Target{Conn: conn, MaxKeyBytes: 4096, MaxValueBytes: 1 << 20})
//	}
package state
