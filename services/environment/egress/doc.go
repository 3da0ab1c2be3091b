// Package egress is the network gate of one sandboxed invocation: an
// HTTP/1.1 proxy that an environment backend runs on a Unix socket, the
// only network the sandbox has.
//
// The proxy decides which destinations are reachable and holds the API
// credentials the agent inside the sandbox must never see:
//
//   - CONNECT host:port opens a TCP tunnel when the Policy allows it.
//   - A plain HTTP request (absolute form "GET http://host/path", or origin
//     form with a Host header, what curl --unix-socket sends) to a host that
//     has a Credential is re-issued over TLS to https://host with the real
//     credential header set and any client-supplied value removed.
//   - Any other plain HTTP request is forwarded as HTTP when the Policy
//     allows it.
//
// Every destination address goes through the address checks (no loopback,
// private, link-local, CGNAT, multicast, documentation, reserved or
// cloud-metadata addresses, and none of this host's own interface
// addresses) unless the administrator exempted it (Config.AllowPrivate) or
// pinned the host (Config.StaticHosts). The proxy connects to the address it
// checked and never resolves the name a second time, so a DNS answer that
// changes between check and dial (DNS rebinding) cannot bypass the checks;
// a connection that reaches this host anyway is closed before a byte
// is sent.
//
// A name is sent to the resolver only when the policy could allow it by
// name: the first name rule that matches it allows it, or no name rule
// matches it and the default is allow. Any other name is refused unresolved, so a denied request leaks
// nothing through DNS; address (Prefix) rules therefore never allow a name
// on their own. Errors tell the client neither the resolver's address nor
// what a name resolved to.
//
// A denied request gets 403 with a one-line reason in the body and in the
// X-Neuron-Egress-Denied header. Denials are logged and counted (Stats).
// Credential values and header values are never logged, names the client
// chose are logged only as a keyed hash, and every log record is scrubbed
// of the invocation's secrets (Config.Secrets; logging.go).
//
// Files: proxy.go (Config, New, Serve, Close), handler.go (requests,
// tunnels, dialling), policy.go (rules, resolution, the address checks of
// a destination), addr.go (the refused ranges and this host's addresses),
// logging.go (what reaches the logs).
package egress
