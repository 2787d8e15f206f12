package idemd

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
)

const downstreamVersionTag = "idemd-downstream-v1"

// DownstreamKey derives the idempotency key a handler sends to a third party
// (a payment provider) for one step of the operation identified by key. It is
// the same on every retry of the operation and different for every step:
//
//	base64url_nopad(SHA-256(frame("idemd-downstream-v1") || frame(key) || frame(step)))
//	frame(x) = 8-byte big-endian length of x || x
//
// The result is 43 characters of [A-Za-z0-9_-] and reveals nothing about key.
func DownstreamKey(key, step string) string {
	h := sha256.New()
	for _, part := range []string{downstreamVersionTag, key, step} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
