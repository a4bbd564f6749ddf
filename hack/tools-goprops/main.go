// Command goprops answers questions about Go's own parsers, for the Rust
// property tests (tests/properties_go.rs) that compare src/gofmt/parse.rs and
// src/logging.rs with the real thing. One JSON object per line in, one out.
//
// Input lines:
//
//	{"op": "duration"|"int"|"uint"|"level"|"float"|"bool"|"quantity"|"quote", "s": "..."}
//	{"op": "quotebytes", "b": "<base64>"}
//	{"op": "printable"}
//
// Output lines:
//
//	{"int": N} (duration in ns, int, uint, level), {"bits": N} (float64 bits),
//	{"bool": B} (bool; quantity: whether it is zero), {"s": "..."} (quote),
//	{"ranges": [[lo, hi], ...]} (the code points strconv.IsPrint accepts, inclusive),
//	or {"err": "<error text>", "kind": "syntax"|"range"|""}
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"
)

type request struct {
	Op string `json:"op"`
	S  string `json:"s"`
	B  []byte `json:"b"`
}

type response struct {
	Int  *json.Number `json:"int,omitempty"`
	Bits *uint64      `json:"bits,omitempty"`
	Bool *bool        `json:"bool,omitempty"`
	S    *string      `json:"s,omitempty"`
	// Ranges is set (possibly empty) only for "printable".
	Ranges *[][2]rune `json:"ranges,omitempty"`
	Err    string     `json:"err,omitempty"`
	Kind   string     `json:"kind,omitempty"`
}

func failed(err error) response {
	kind := ""
	switch {
	case errors.Is(err, strconv.ErrSyntax):
		kind = "syntax"
	case errors.Is(err, strconv.ErrRange):
		kind = "range"
	}
	return response{Err: err.Error(), Kind: kind}
}

func number(n string) response {
	v := json.Number(n)
	return response{Int: &v}
}

func answer(req request) response {
	switch req.Op {
	case "duration":
		d, err := time.ParseDuration(req.S)
		if err != nil {
			return failed(err)
		}
		return number(strconv.FormatInt(int64(d), 10))
	case "int":
		n, err := strconv.ParseInt(req.S, 0, 64)
		if err != nil {
			return failed(err)
		}
		return number(strconv.FormatInt(n, 10))
	case "uint":
		n, err := strconv.ParseUint(req.S, 0, 64)
		if err != nil {
			return failed(err)
		}
		return number(strconv.FormatUint(n, 10))
	case "level":
		n, err := strconv.ParseUint(req.S, 10, 31)
		if err != nil {
			return failed(err)
		}
		return number(strconv.FormatUint(n, 10))
	case "float":
		f, err := strconv.ParseFloat(req.S, 64)
		if err != nil {
			return failed(err)
		}
		bits := math.Float64bits(f)
		return response{Bits: &bits}
	case "bool":
		b, err := strconv.ParseBool(req.S)
		if err != nil {
			return failed(err)
		}
		return response{Bool: &b}
	case "quantity":
		q, err := resource.ParseQuantity(req.S)
		if err != nil {
			return failed(err)
		}
		zero := q.IsZero()
		return response{Bool: &zero}
	case "quote":
		s := strconv.Quote(req.S)
		return response{S: &s}
	case "quotebytes":
		s := strconv.Quote(string(req.B))
		return response{S: &s}
	case "printable":
		ranges := [][2]rune{}
		start := rune(-1)
		for r := rune(0); r <= unicode.MaxRune+1; r++ {
			printable := r <= unicode.MaxRune && strconv.IsPrint(r)
			if printable && start < 0 {
				start = r
			} else if !printable && start >= 0 {
				ranges = append(ranges, [2]rune{start, r - 1})
				start = -1
			}
		}
		return response{Ranges: &ranges}
	default:
		return response{Err: fmt.Sprintf("unknown op %q", req.Op)}
	}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for in.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp = response{Err: fmt.Sprintf("bad input: %v", err), Kind: "input"}
		} else {
			resp = answer(req)
		}
		if err := enc.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		// Flush per line: the caller may wait for each answer.
		if err := out.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
