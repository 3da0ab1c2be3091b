// Package scope encodes a layer0 Scope (types.v1.Scope) as bytes for use
// as a storage-key prefix.
//
// The encoding is a kind byte followed by each id of that kind as a
// uvarint length and the id's bytes:
//
//	session:  0x01 len session_id
//	workflow: 0x02 len workflow_id
//	agent:    0x03 len workflow_id len agent_id
//	global:   0x04
//	custom:   0x05 len name
//
// It is injective (distinct scopes never encode to the same bytes) and
// self-delimiting (no encoded scope is a prefix of another), so a store
// that prefixes every key with the encoded scope keeps scopes disjoint
// whatever the keys and ids contain: "..", "/", NUL, unicode or very long
// strings. Decode is strict and accepts only bytes Encode produces.
//
// Validate checks a scope the way the proto's constraints do (exactly one
// kind set, ids of 1 to 256 characters) and returns errs.InvalidArgument
// with a message naming the problem; Encode validates first.
package scope
