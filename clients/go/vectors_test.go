package idemd_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	idemd "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

func readJSON(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestFingerprintVectors holds the local fingerprint v1 to every vector in
// proto/testdata/fingerprint-v1.json: digests, canonical bodies and error
// classes.
func TestFingerprintVectors(t *testing.T) {
	var file struct {
		Version string `json:"version"`
		Vectors []struct {
			Name             string   `json:"name"`
			Method           string   `json:"method"`
			Path             string   `json:"path"`
			ContentType      string   `json:"content_type"`
			BodyUTF8         *string  `json:"body_utf8"`
			BodyHex          *string  `json:"body_hex"`
			IgnoreFields     []string `json:"ignore_fields"`
			CanonicalBodyHex *string  `json:"canonical_body_hex"`
			SHA256Hex        *string  `json:"sha256_hex"`
			Error            *string  `json:"error"`
		} `json:"vectors"`
	}
	readJSON(t, filepath.Join(testserver.RepoRoot(), "proto", "testdata", "fingerprint-v1.json"), &file)
	if file.Version != "v1" || len(file.Vectors) < 25 {
		t.Fatalf("unexpected vector file: version %q, %d vectors", file.Version, len(file.Vectors))
	}
	classes := map[string]error{
		"malformed_json":  idemd.ErrMalformedJSON,
		"duplicate_key":   idemd.ErrDuplicateKey,
		"too_deep":        idemd.ErrTooDeep,
		"invalid_pointer": idemd.ErrInvalidPointer,
	}
	for _, v := range file.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			var body []byte
			switch {
			case v.BodyUTF8 != nil && v.BodyHex == nil:
				body = []byte(*v.BodyUTF8)
			case v.BodyHex != nil && v.BodyUTF8 == nil:
				var err error
				if body, err = hex.DecodeString(*v.BodyHex); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatal("exactly one of body_utf8/body_hex expected")
			}
			req := idemd.HTTPRequest{Method: v.Method, Path: v.Path, ContentType: v.ContentType,
				Body: body, IgnoreFields: v.IgnoreFields}
			digest, err := idemd.Fingerprint(req)
			switch {
			case v.Error != nil && v.SHA256Hex == nil:
				class, ok := classes[*v.Error]
				if !ok {
					t.Fatalf("unknown error class %q in the vector file", *v.Error)
				}
				if !errors.Is(err, class) {
					t.Fatalf("want error class %s, got %v", *v.Error, err)
				}
				var fe *idemd.FingerprintError
				if !errors.As(err, &fe) {
					t.Fatalf("want *FingerprintError, got %T", err)
				}
			case v.SHA256Hex != nil && v.Error == nil:
				if err != nil {
					t.Fatal(err)
				}
				if got := hex.EncodeToString(digest[:]); got != *v.SHA256Hex {
					t.Errorf("sha256 = %s, want %s", got, *v.SHA256Hex)
				}
				canonical, err := idemd.CanonicalBody(req)
				if err != nil {
					t.Fatal(err)
				}
				if v.CanonicalBodyHex == nil {
					t.Fatal("vector has sha256_hex but no canonical_body_hex")
				}
				if got := hex.EncodeToString(canonical); got != *v.CanonicalBodyHex {
					t.Errorf("canonical body = %q, want hex %s", canonical, *v.CanonicalBodyHex)
				}
			default:
				t.Fatal("exactly one of error/sha256_hex expected")
			}
		})
	}
}

// TestDownstreamKeyVectors holds DownstreamKey to
// clients/conformance/downstream-key-v1.json.
func TestDownstreamKeyVectors(t *testing.T) {
	var file struct {
		Version string `json:"version"`
		Vectors []struct {
			Key           string `json:"key"`
			Step          string `json:"step"`
			DownstreamKey string `json:"downstream_key"`
		} `json:"vectors"`
	}
	readJSON(t, filepath.Join(testserver.ConformanceDir(), "downstream-key-v1.json"), &file)
	if file.Version != "v1" || len(file.Vectors) == 0 {
		t.Fatalf("unexpected vector file: version %q, %d vectors", file.Version, len(file.Vectors))
	}
	shape := regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
	for i, v := range file.Vectors {
		got := idemd.DownstreamKey(v.Key, v.Step)
		if got != v.DownstreamKey {
			t.Errorf("vector %d (step %q): got %s, want %s", i, v.Step, got, v.DownstreamKey)
		}
		if !shape.MatchString(got) {
			t.Errorf("vector %d: %q is not 43 characters of [A-Za-z0-9_-]", i, got)
		}
		// The method handlers use must be the same derivation.
		if m := (idemd.Execution{Key: v.Key}).DownstreamKey(v.Step); m != v.DownstreamKey {
			t.Errorf("vector %d (step %q): Execution.DownstreamKey = %s, want %s", i, v.Step, m, v.DownstreamKey)
		}
	}
}

// Edge cases beyond the shared vectors, pinned to the Rust implementation.
func TestFingerprintEdgeCases(t *testing.T) {
	canonical := func(body string, ignore ...string) (string, error) {
		out, err := idemd.CanonicalBody(idemd.HTTPRequest{Method: "POST", Path: "/p",
			ContentType: "application/json", Body: []byte(body), IgnoreFields: ignore})
		return string(out), err
	}
	for in, want := range map[string]string{
		`42E+2`:                       `42e2`,
		`0.0042`:                      `42e-4`,
		`-0`:                          `0`,
		`0e10`:                        `0`,
		`100.50`:                      `1005e-1`,
		`"\u00e9\/"`:                  `"é/"`,
		`"\u001f\b"`:                  `"\u001f\b"`,
		`{"b":1,"a":{"d":[],"c":{}}}`: `{"a":{"c":{},"d":[]},"b":1}`,
		`1e1000000000`:                `1e1000000000`,
	} {
		got, err := canonical(in)
		if err != nil || got != want {
			t.Errorf("canonical(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"{", "[1,]", "01", "1.", "1e", "+1", `"\x"`, "\"\x01\"", "tru", "1 2",
		"\ufeff{}", "\"\xff\"", "1e1000000001", "1e99999999999999999999", `"\udc00"`, `"\ud800\u0041"`} {
		if _, err := canonical(bad); !errors.Is(err, idemd.ErrMalformedJSON) {
			t.Errorf("canonical(%q): want malformed_json, got %v", bad, err)
		}
	}
	got, err := canonical(`{"a":{"b":1,"c":2},"l":[0,1,2],"x/y":3,"m~n":4}`,
		"/a/b", "/l/0", "/l/2", "/x~1y", "/m~0n", "/missing/deep", "/l/01", "/a/b")
	if err != nil || got != `{"a":{"c":2},"l":[1]}` {
		t.Errorf("pointer removal: got %q, %v", got, err)
	}
	many := make([]string, idemd.MaxIgnoreFields+1)
	for i := range many {
		many[i] = "/a"
	}
	if _, err := canonical(`{}`, many...); !errors.Is(err, idemd.ErrInvalidPointer) {
		t.Errorf("65 pointers: want invalid_pointer, got %v", err)
	}
	// Pointers are checked even when the body is not JSON (as the server does).
	if _, err := idemd.CanonicalBody(idemd.HTTPRequest{ContentType: "text/plain", Body: []byte("x"),
		IgnoreFields: []string{"nope"}}); !errors.Is(err, idemd.ErrInvalidPointer) {
		t.Errorf("invalid pointer with a text body: got %v", err)
	}
	// Length prefixes keep fields apart.
	a, _ := idemd.Fingerprint(idemd.HTTPRequest{Method: "POST", Path: "/ab", Body: []byte("c")})
	b, _ := idemd.Fingerprint(idemd.HTTPRequest{Method: "POST", Path: "/a", Body: []byte("bc")})
	if a == b {
		t.Error("length prefixes must keep /ab+c and /a+bc apart")
	}
}

// TestConsumerKeyVectors holds the consumer helper's key (from the header,
// the last one of a repeated name; or from the position) and the
// fingerprint its claims carry to clients/conformance/consumer-key-v1.json,
// which every SDK reads: a message one SDK consumed is a duplicate to the
// others only if they all agree.
func TestConsumerKeyVectors(t *testing.T) {
	var file struct {
		Version   int    `json:"version"`
		KeyHeader string `json:"key_header"`
		Vectors   []struct {
			Name            string      `json:"name"`
			Topic           string      `json:"topic"`
			Partition       int32       `json:"partition"`
			Offset          int64       `json:"offset"`
			Headers         [][2]string `json:"headers"`
			ValueHex        string      `json:"value_hex"`
			Endpoint        string      `json:"endpoint"`
			KeyFromHeader   *string     `json:"key_from_header"`
			KeyFromPosition string      `json:"key_from_position"`
			FingerprintHex  string      `json:"fingerprint_hex"`
		} `json:"vectors"`
	}
	readJSON(t, filepath.Join(testserver.ConformanceDir(), "consumer-key-v1.json"), &file)
	if file.Version != 1 || len(file.Vectors) == 0 {
		t.Fatalf("consumer-key-v1.json: version %d, %d vectors", file.Version, len(file.Vectors))
	}
	for _, v := range file.Vectors {
		value, err := hex.DecodeString(v.ValueHex)
		if err != nil {
			t.Fatalf("%s: value_hex: %v", v.Name, err)
		}
		msg := idemd.Message{Topic: v.Topic, Partition: v.Partition, Offset: v.Offset, Value: value}
		for _, h := range v.Headers {
			msg.Headers = append(msg.Headers, idemd.MessageHeader{Key: h[0], Value: []byte(h[1])})
		}
		key, err := idemd.KeyFromHeader(file.KeyHeader)(msg)
		var missing *idemd.MissingKeyError
		switch {
		case v.KeyFromHeader == nil && !errors.As(err, &missing):
			t.Errorf("%s: key from header %q, %v; want a MissingKeyError", v.Name, key, err)
		case v.KeyFromHeader != nil && (err != nil || key != *v.KeyFromHeader):
			t.Errorf("%s: key from header %q, %v; want %q", v.Name, key, err, *v.KeyFromHeader)
		}
		if key, err := idemd.KeyFromPosition(msg); err != nil || key != v.KeyFromPosition {
			t.Errorf("%s: key from position %q, %v; want %q", v.Name, key, err, v.KeyFromPosition)
		}
		digest, err := idemd.Fingerprint(idemd.HTTPRequest{Method: "CONSUME", Path: v.Endpoint, Body: value})
		if err != nil || hex.EncodeToString(digest[:]) != v.FingerprintHex {
			t.Errorf("%s: fingerprint %x, %v; want %s", v.Name, digest, err, v.FingerprintHex)
		}
	}
}
