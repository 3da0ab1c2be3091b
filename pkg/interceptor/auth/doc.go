// Package auth authenticates gRPC callers by bearer token or verified
// client certificate (mTLS) and authorizes each call by method: a
// principal may call only the methods its allow list names. A principal
// allowed only StateService Read/List/Search is the read-only credential
// operators get.
//
// The policy file is JSON:
//
//	{"principals": [
//	  {"name": "orchestrator", "tokens": ["..."], "allow": ["*"]},
//	  {"name": "operator", "tokens": ["..."], "allow": [
//	    "/layer0.state.v1.StateService/Read",
//	    "/layer0.state.v1.StateService/List",
//	    "/layer0.state.v1.StateService/Search"]},
//	  {"name": "environment", "allow": ["/layer0.operator.v1.OperatorService/*"]}
//	]}
//
// A principal without tokens can authenticate only with a client
// certificate whose subject common name (or a DNS SAN) equals its name.
// Allow patterns are "*", "/pkg.Service/*" or a full method name.
package auth
