// Package provider defines the operator's internal model interface: the
// one small boundary between the ReAct loop and a language model. The
// types here are the loop's lingua franca; they are neither layer0 protocol
// types nor any vendor's wire format. Each provider (scripted, and the real
// SDK-backed ones) maps them to and from its own API.
//
// A Provider never retries on behalf of the loop's caller beyond its own
// transport policy, and reports failures as errors wrapping an errs kind:
// errs.Retryable when a retry may succeed (429, 5xx, connection reset),
// errs.NonRetryable when it will not (bad request, refused credentials),
// errs.InvalidArgument for a request the provider cannot express.
//
// A provider takes everything it needs in its Config and never reads the
// environment. What the binaries know of each real provider (its name,
// key and base URL variables, public host, default model, flags) is one
// list, package providers; the operator's wiring reads the variables it
// names.
package provider
