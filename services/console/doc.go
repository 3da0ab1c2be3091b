// Package console is neuron's web console: a browser page to see
// workflows run, approve what they want to do next, find where the money
// went, edit agents and browse the State service.
//
// # How it is built: a thin Go backend
//
// The browser never speaks gRPC. A small Go HTTP server (this package)
// serves the pages, embedded in the binary with go:embed (plain HTML,
// CSS and JavaScript modules: no framework, no bundler, no build step,
// nothing from a CDN, so it works offline), and a JSON API whose every
// handler is one call, or one stream, of the real services'
// generated gRPC clients, made with the logged-in person's bearer token.
// The console keeps no data of its own but its sessions: there is no
// second source of truth. Live pages are server-sent events fed by the
// orchestrator's WatchWorkflow stream (one workflow: its durable events,
// the text and tool calls of the call running now, and its end) and by
// ListWorkflows (the list).
//
// gRPC-Web or Connect transcoding would put the services' methods in the
// browser directly; it was not chosen because the services would then
// take browser requests themselves (CORS, cookies and CSRF in every
// service, or a translating proxy that is itself a backend), a bearer
// token would live in the page's JavaScript where any injected script
// could read it, and the front end would need generated TypeScript and a
// bundler in the build. The thin backend keeps the token server-side
// behind an HttpOnly cookie, and its handlers are a few lines each.
//
// # Auth
//
// Outside --dev, /login takes a token of the services' auth policy
// (pkg/interceptor/auth). The console checks it by probing the services
// (probe.go: a request that can never be valid answers PERMISSION_DENIED,
// UNAUTHENTICATED or INVALID_ARGUMENT, because the services authorize
// before they validate) and keeps it in a server-side session whose id
// is a Secure, HttpOnly, SameSite=Strict __Host- cookie. Every
// state-changing request must be same-origin (Origin and Sec-Fetch-Site)
// and carry the session's CSRF token (X-CSRF-Token). The pages hide what
// the probes (and later calls) found the principal may not call; the
// services still decide every call. In --dev (neuron up) there is no
// login, only loopback Host names are answered, and the CSRF rules hold.
//
// # Files, from the request inwards
//
//   - run.go: Config and Run (listen, serve, stop), as the binary and
//     neuron up start it
//   - server.go: routes, security headers, sessions and CSRF checks,
//     login and logout
//   - session.go: the session store and cookie
//   - probe.go: what a token may call, asked of the services
//   - api.go: the JSON API, one service call per handler
//   - sse.go: the live streams (WatchWorkflow, the workflows list)
//   - trace.go: the trace viewer's query of the trace store (Jaeger's
//     query API, --traces-url), after GetWorkflow with the session's token
//   - errors.go: gRPC statuses to HTTP answers with the field violations
//   - web/: the pages (index.html, login.html, app.js, style.css)
package console
