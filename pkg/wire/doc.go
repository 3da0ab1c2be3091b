// Package wire pins the wire format of the layer0 contracts. It holds no
// production code, only tests:
//
//   - every message of every layer0 package, fully populated and once per
//     oneof member and enum value, survives proto binary and protojson;
//   - golden JSON fixtures in testdata/ fix the JSON form of representative
//     messages, so a wire change shows up as a diff in review;
//   - fields with explicit presence (optional scalars, wrapper messages)
//     keep it through both encodings, zero values included;
//   - the buf.validate annotations accept valid messages and reject the
//     invalid ones they are meant to.
//
// Changing a fixture is a deliberate wire change: regenerate them with
//
//	go test ./pkg/wire -update
//
// and review the diff as you would a proto change.
package wire
