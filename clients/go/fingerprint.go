package idemd

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Fingerprint v1 (docs/fingerprint.md): the digest that tells "the same
// request again" from "a different request under a reused key".
//
//	fingerprint = SHA-256( frame("idemd-fingerprint-v1")
//	                    || frame(ASCII-uppercase(method))
//	                    || frame(path)
//	                    || frame(canonical_body) )
//	frame(x)    = 8-byte big-endian length of x || x
//
// The SDK computes the same digest as the server, so a caller can send
// ClaimRequest.sha256 instead of the request (required for bodies over 1 MiB).

const (
	fingerprintVersionTag = "idemd-fingerprint-v1"
	// MaxJSONDepth is the deepest nesting of arrays and objects accepted.
	MaxJSONDepth = 128
	// MaxIgnoreFields is the most ignore_fields pointers per request.
	MaxIgnoreFields = 64
	// MaxPointerBytes is the longest accepted ignore_fields pointer.
	MaxPointerBytes = 1024
	// MaxServerBodyBytes is the largest body the server fingerprints itself;
	// larger requests must send a local fingerprint.
	MaxServerBodyBytes = 1 << 20

	maxExponentMagnitude = 1_000_000_000
)

// Error classes of fingerprint v1, usable with errors.Is on a
// *FingerprintError.
var (
	ErrMalformedJSON  = errors.New("malformed_json")
	ErrDuplicateKey   = errors.New("duplicate_key")
	ErrTooDeep        = errors.New("too_deep")
	ErrInvalidPointer = errors.New("invalid_pointer")
)

// FingerprintError says why a fingerprint cannot be computed. Class is one of
// ErrMalformedJSON, ErrDuplicateKey, ErrTooDeep, ErrInvalidPointer. The
// message never contains body content.
type FingerprintError struct {
	Class  error
	Offset int    // byte offset in the body (JSON errors), or -1
	Detail string // what was wrong
}

func (e *FingerprintError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("idemd: fingerprint: %s at byte %d: %s", e.Class, e.Offset, e.Detail)
	}
	return fmt.Sprintf("idemd: fingerprint: %s: %s", e.Class, e.Detail)
}

// Is reports whether target is this error's class.
func (e *FingerprintError) Is(target error) bool { return target == e.Class }

// Unwrap returns the error class.
func (e *FingerprintError) Unwrap() error { return e.Class }

// Fingerprint computes fingerprint v1 of req locally (req.IgnoreFields are
// dropped from JSON bodies; the endpoint policy's ignore_fields are not known
// to the client, so list them in req.IgnoreFields too when the endpoint has
// any). Unlike the server, it accepts bodies of any size.
func Fingerprint(req HTTPRequest) ([32]byte, error) {
	body, err := CanonicalBody(req)
	if err != nil {
		return [32]byte{}, err
	}
	h := sha256.New()
	for _, part := range [][]byte{
		[]byte(fingerprintVersionTag),
		[]byte(asciiUpper(req.Method)),
		[]byte(req.Path),
		body,
	} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

// CanonicalBody returns the body that fingerprint v1 hashes: canonical JSON
// for non-empty application/json and +json bodies, the bytes as sent
// otherwise.
func CanonicalBody(req HTTPRequest) ([]byte, error) {
	pointers, err := parseIgnoreFields(req.IgnoreFields)
	if err != nil {
		return nil, err
	}
	if len(req.Body) == 0 || !IsJSONContentType(req.ContentType) {
		return slices.Clone(req.Body), nil
	}
	value, err := parseJSON(req.Body)
	if err != nil {
		return nil, err
	}
	value = removePointers(value, pointers)
	var out bytes.Buffer
	out.Grow(len(req.Body))
	writeValue(&out, value)
	return out.Bytes(), nil
}

// IsJSONContentType reports whether a media type selects JSON
// canonicalization: application/json or any */*+json type, parameters
// ignored, case-insensitive.
func IsJSONContentType(contentType string) bool {
	essence, _, _ := strings.Cut(contentType, ";")
	essence = strings.ToLower(strings.TrimSpace(essence))
	return essence == "application/json" || (strings.Contains(essence, "/") && strings.HasSuffix(essence, "+json"))
}

func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// JSON pointers (RFC 6901)

func pointerError(index int, detail string) error {
	return &FingerprintError{Class: ErrInvalidPointer, Offset: -1, Detail: fmt.Sprintf("ignore_fields[%d] %s", index, detail)}
}

func parseIgnoreFields(pointers []string) ([][]string, error) {
	if len(pointers) > MaxIgnoreFields {
		return nil, &FingerprintError{Class: ErrInvalidPointer, Offset: -1,
			Detail: fmt.Sprintf("%d ignore_fields entries; the limit is %d", len(pointers), MaxIgnoreFields)}
	}
	out := make([][]string, 0, len(pointers))
	for i, p := range pointers {
		if len(p) > MaxPointerBytes {
			return nil, pointerError(i, fmt.Sprintf("is %d bytes; the limit is %d", len(p), MaxPointerBytes))
		}
		if p == "" {
			return nil, pointerError(i, "must not be the empty pointer (the whole document)")
		}
		if p[0] != '/' {
			return nil, pointerError(i, "must start with '/'")
		}
		var tokens []string
		for _, raw := range strings.Split(p[1:], "/") {
			var tok strings.Builder
			for j := 0; j < len(raw); j++ {
				if raw[j] != '~' {
					tok.WriteByte(raw[j])
					continue
				}
				if j+1 < len(raw) && (raw[j+1] == '0' || raw[j+1] == '1') {
					if raw[j+1] == '0' {
						tok.WriteByte('~')
					} else {
						tok.WriteByte('/')
					}
					j++
					continue
				}
				return nil, pointerError(i, "has an invalid '~' escape (only ~0 and ~1 are allowed)")
			}
			tokens = append(tokens, tok.String())
		}
		out = append(out, tokens)
	}
	return out, nil
}

// pathStep is one resolved pointer step: an object member by its position
// among the members, or an array element. Members sort before elements, as in
// the reference implementation; the order only matters between siblings of
// the same container, where the kinds never mix.
type pathStep struct {
	element bool
	index   int
}

func comparePaths(a, b []pathStep) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i].element != b[i].element {
			if !a[i].element {
				return -1
			}
			return 1
		}
		if a[i].index != b[i].index {
			return a[i].index - b[i].index
		}
	}
	return len(a) - len(b)
}

func resolvePointer(v jsonValue, tokens []string) ([]pathStep, bool) {
	path := make([]pathStep, 0, len(tokens))
	for _, tok := range tokens {
		switch v.kind {
		case kindObject:
			idx := slices.IndexFunc(v.members, func(m member) bool { return m.name == tok })
			if idx < 0 {
				return nil, false
			}
			path = append(path, pathStep{index: idx})
			v = v.members[idx].value
		case kindArray:
			idx, ok := arrayIndex(tok)
			if !ok || idx >= len(v.elements) {
				return nil, false
			}
			path = append(path, pathStep{element: true, index: idx})
			v = v.elements[idx]
		default:
			return nil, false
		}
	}
	return path, true
}

func arrayIndex(tok string) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(tok)
	return n, err == nil
}

// removePointers drops what each pointer refers to in the document as given:
// every pointer is resolved first, then the deepest and highest-indexed paths
// are removed first so that no removal shifts another pointer's target.
func removePointers(v jsonValue, pointers [][]string) jsonValue {
	var paths [][]pathStep
	for _, tokens := range pointers {
		if p, ok := resolvePointer(v, tokens); ok {
			paths = append(paths, p)
		}
	}
	slices.SortFunc(paths, comparePaths)
	paths = slices.CompactFunc(paths, func(a, b []pathStep) bool { return comparePaths(a, b) == 0 })
	for i := len(paths) - 1; i >= 0; i-- {
		v = removePath(v, paths[i])
	}
	return v
}

func removePath(v jsonValue, path []pathStep) jsonValue {
	if len(path) == 0 {
		// The empty pointer is refused at parse time; never drop the root.
		return v
	}
	step := path[0]
	switch {
	case v.kind == kindObject && !step.element && step.index < len(v.members):
		if len(path) == 1 {
			v.members = slices.Delete(v.members, step.index, step.index+1)
		} else {
			v.members[step.index].value = removePath(v.members[step.index].value, path[1:])
		}
	case v.kind == kindArray && step.element && step.index < len(v.elements):
		if len(path) == 1 {
			v.elements = slices.Delete(v.elements, step.index, step.index+1)
		} else {
			v.elements[step.index] = removePath(v.elements[step.index], path[1:])
		}
	}
	return v
}

// ---------------------------------------------------------------------------
// Strict JSON parser (RFC 8259) keeping exact decimal numbers

type jsonKind uint8

const (
	kindNull jsonKind = iota
	kindBool
	kindNumber // text holds the canonical form
	kindString
	kindArray
	kindObject
)

type member struct {
	name  string
	value jsonValue
}

type jsonValue struct {
	kind     jsonKind
	boolean  bool
	text     string
	elements []jsonValue
	members  []member // document order; sorted on output
}

type jsonParser struct {
	in  []byte
	pos int
}

func parseJSON(in []byte) (jsonValue, error) {
	p := &jsonParser{in: in}
	p.skipWhitespace()
	v, err := p.value(0)
	if err != nil {
		return jsonValue{}, err
	}
	p.skipWhitespace()
	if p.pos != len(p.in) {
		return jsonValue{}, p.malformed("unexpected data after the JSON value")
	}
	return v, nil
}

func (p *jsonParser) malformed(detail string) error {
	return &FingerprintError{Class: ErrMalformedJSON, Offset: p.pos, Detail: detail}
}

func (p *jsonParser) peek() int {
	if p.pos < len(p.in) {
		return int(p.in[p.pos])
	}
	return -1
}

func (p *jsonParser) skipWhitespace() {
	for {
		switch p.peek() {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (jsonValue, error) {
	switch c := p.peek(); {
	case c == -1:
		return jsonValue{}, p.malformed("unexpected end of input")
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		return jsonValue{kind: kindString, text: s}, err
	case c == 't':
		return p.literal("true", jsonValue{kind: kindBool, boolean: true})
	case c == 'f':
		return p.literal("false", jsonValue{kind: kindBool})
	case c == 'n':
		return p.literal("null", jsonValue{kind: kindNull})
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	default:
		return jsonValue{}, p.malformed("unexpected character")
	}
}

func (p *jsonParser) literal(lit string, v jsonValue) (jsonValue, error) {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
		return jsonValue{}, p.malformed("invalid literal")
	}
	p.pos += len(lit)
	return v, nil
}

func (p *jsonParser) object(depth int) (jsonValue, error) {
	if depth > MaxJSONDepth {
		return jsonValue{}, &FingerprintError{Class: ErrTooDeep, Offset: p.pos,
			Detail: fmt.Sprintf("nesting deeper than %d levels", MaxJSONDepth)}
	}
	p.pos++ // '{'
	v := jsonValue{kind: kindObject}
	seen := map[string]struct{}{}
	p.skipWhitespace()
	if p.peek() == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipWhitespace()
		if p.peek() != '"' {
			return jsonValue{}, p.malformed("expected a string object key")
		}
		nameOffset := p.pos
		name, err := p.str()
		if err != nil {
			return jsonValue{}, err
		}
		if _, dup := seen[name]; dup {
			return jsonValue{}, &FingerprintError{Class: ErrDuplicateKey, Offset: nameOffset,
				Detail: "an object repeats a member name"}
		}
		seen[name] = struct{}{}
		p.skipWhitespace()
		if p.peek() != ':' {
			return jsonValue{}, p.malformed("expected ':' after object key")
		}
		p.pos++
		p.skipWhitespace()
		child, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		v.members = append(v.members, member{name: name, value: child})
		p.skipWhitespace()
		switch p.peek() {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return jsonValue{}, p.malformed("expected ',' or '}' in object")
		}
	}
}

func (p *jsonParser) array(depth int) (jsonValue, error) {
	if depth > MaxJSONDepth {
		return jsonValue{}, &FingerprintError{Class: ErrTooDeep, Offset: p.pos,
			Detail: fmt.Sprintf("nesting deeper than %d levels", MaxJSONDepth)}
	}
	p.pos++ // '['
	v := jsonValue{kind: kindArray, elements: []jsonValue{}}
	p.skipWhitespace()
	if p.peek() == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipWhitespace()
		child, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		v.elements = append(v.elements, child)
		p.skipWhitespace()
		switch p.peek() {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return jsonValue{}, p.malformed("expected ',' or ']' in array")
		}
	}
}

func (p *jsonParser) str() (string, error) {
	p.pos++ // opening quote
	var out []byte
	for {
		c := p.peek()
		switch {
		case c == -1:
			return "", p.malformed("unterminated string")
		case c == '"':
			p.pos++
			return string(out), nil
		case c == '\\':
			p.pos++
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			out = utf8.AppendRune(out, r)
		case c < 0x20:
			return "", p.malformed("unescaped control character in string")
		case c < 0x80:
			out = append(out, byte(c))
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.malformed("invalid UTF-8 in string")
			}
			out = append(out, p.in[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

func (p *jsonParser) escape() (rune, error) {
	c := p.peek()
	if c == -1 {
		return 0, p.malformed("unterminated escape")
	}
	p.pos++
	switch c {
	case '"':
		return '"', nil
	case '\\':
		return '\\', nil
	case '/':
		return '/', nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		first, err := p.hex4()
		if err != nil {
			return 0, err
		}
		switch {
		case 0xD800 <= first && first <= 0xDBFF:
			if !bytes.HasPrefix(p.in[p.pos:], []byte(`\u`)) {
				return 0, p.malformed("unpaired surrogate escape")
			}
			p.pos += 2
			second, err := p.hex4()
			if err != nil {
				return 0, err
			}
			if second < 0xDC00 || second > 0xDFFF {
				return 0, p.malformed("unpaired surrogate escape")
			}
			return 0x10000 + (first-0xD800)<<10 + (second - 0xDC00), nil
		case 0xDC00 <= first && first <= 0xDFFF:
			return 0, p.malformed("unpaired surrogate escape")
		default:
			return first, nil
		}
	default:
		return 0, p.malformed("invalid escape")
	}
}

func (p *jsonParser) hex4() (rune, error) {
	if p.pos+4 > len(p.in) {
		return 0, p.malformed("truncated \\u escape")
	}
	var code rune
	for _, d := range p.in[p.pos : p.pos+4] {
		var nibble byte
		switch {
		case '0' <= d && d <= '9':
			nibble = d - '0'
		case 'a' <= d && d <= 'f':
			nibble = d - 'a' + 10
		case 'A' <= d && d <= 'F':
			nibble = d - 'A' + 10
		default:
			return 0, p.malformed("invalid \\u escape")
		}
		code = code<<4 | rune(nibble)
	}
	p.pos += 4
	return code, nil
}

func (p *jsonParser) digits() []byte {
	start := p.pos
	for c := p.peek(); '0' <= c && c <= '9'; c = p.peek() {
		p.pos++
	}
	return p.in[start:p.pos]
}

func (p *jsonParser) number() (jsonValue, error) {
	negative := p.peek() == '-'
	if negative {
		p.pos++
	}
	var intDigits []byte
	switch c := p.peek(); {
	case c == '0':
		intDigits = p.in[p.pos : p.pos+1]
		p.pos++
	case '1' <= c && c <= '9':
		intDigits = p.digits()
	default:
		return jsonValue{}, p.malformed("invalid number")
	}
	var fracDigits []byte
	if p.peek() == '.' {
		p.pos++
		if fracDigits = p.digits(); len(fracDigits) == 0 {
			return jsonValue{}, p.malformed("invalid number: no digits after '.'")
		}
	}
	var exponent int64
	if c := p.peek(); c == 'e' || c == 'E' {
		p.pos++
		expNegative := false
		switch p.peek() {
		case '-':
			expNegative = true
			p.pos++
		case '+':
			p.pos++
		}
		expDigits := p.digits()
		if len(expDigits) == 0 {
			return jsonValue{}, p.malformed("invalid number: no digits in exponent")
		}
		for _, d := range expDigits {
			exponent = exponent*10 + int64(d-'0')
			if exponent > maxExponentMagnitude {
				return jsonValue{}, p.malformed("number exponent out of range")
			}
		}
		if expNegative {
			exponent = -exponent
		}
	}
	return jsonValue{kind: kindNumber, text: canonicalNumber(negative, intDigits, fracDigits, exponent)}, nil
}

// canonicalNumber writes a number by its exact decimal value: an optional
// '-', the significant digits without leading or trailing zeros, and
// e<exponent> when the exponent is not zero. Zero of any form is "0".
func canonicalNumber(negative bool, intDigits, fracDigits []byte, exponent int64) string {
	digits := make([]byte, 0, len(intDigits)+len(fracDigits))
	digits = append(digits, intDigits...)
	digits = append(digits, fracDigits...)
	exp := exponent - int64(len(fracDigits))
	start := bytes.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if start < 0 {
		return "0"
	}
	end := len(digits)
	for end > start && digits[end-1] == '0' {
		end--
		exp++
	}
	var b strings.Builder
	if negative {
		b.WriteByte('-')
	}
	b.Write(digits[start:end])
	if exp != 0 {
		b.WriteByte('e')
		b.WriteString(strconv.FormatInt(exp, 10))
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// Canonical serializer

func writeValue(out *bytes.Buffer, v jsonValue) {
	switch v.kind {
	case kindNull:
		out.WriteString("null")
	case kindBool:
		if v.boolean {
			out.WriteString("true")
		} else {
			out.WriteString("false")
		}
	case kindNumber:
		out.WriteString(v.text)
	case kindString:
		writeString(out, v.text)
	case kindArray:
		out.WriteByte('[')
		for i, e := range v.elements {
			if i > 0 {
				out.WriteByte(',')
			}
			writeValue(out, e)
		}
		out.WriteByte(']')
	case kindObject:
		// Go strings compare by bytes: UTF-8 byte order = code point order.
		sorted := slices.Clone(v.members)
		slices.SortFunc(sorted, func(a, b member) int { return strings.Compare(a.name, b.name) })
		out.WriteByte('{')
		for i, m := range sorted {
			if i > 0 {
				out.WriteByte(',')
			}
			writeString(out, m.name)
			out.WriteByte(':')
			writeValue(out, m.value)
		}
		out.WriteByte('}')
	}
}

const hexDigits = "0123456789abcdef"

func writeString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			out.WriteString(`\"`)
		case '\\':
			out.WriteString(`\\`)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			if c < 0x20 {
				out.WriteString(`\u00`)
				out.WriteByte(hexDigits[c>>4])
				out.WriteByte(hexDigits[c&0xF])
			} else {
				out.WriteByte(c) // strings hold valid UTF-8: copy bytes as is
			}
		}
	}
	out.WriteByte('"')
}
