// Package msgsize holds the largest gRPC message a neuron service sends
// or accepts, the one fact grpcserver (its default send and receive
// limits), grpcclient (the same limits on every connection it dials) and
// the operator's one-shot mode (its stdin limit) derive theirs from, so
// an output a server may send a client may receive.
package msgsize

// Max is the largest message, in bytes, sent or received. grpc-go's own
// default receive limit (4 MiB) is far below it, so a client that does
// not set its limits from Max fails on large outputs the server sends.
const Max = 16 << 20
