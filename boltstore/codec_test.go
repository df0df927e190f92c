package boltstore

import (
	"errors"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/google/go-cmp/cmp"
)

func codecSamples() []rec {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 123, time.UTC).UnixNano()
	return []rec{
		{state: stateProcessing, token: 1, leaseUntil: t0 + int64(time.Second), expiresAt: t0 + int64(time.Hour), fp: "fp"},
		{state: stateProcessing, token: 1<<64 - 1, leaseUntil: -5, expiresAt: -1, fp: ""},
		{state: stateDone, token: 7, expiresAt: t0, fp: "sha256:abc",
			resp: idempotency.Response{Status: 201, Body: []byte("created")}},
		{state: stateDone, token: 8, expiresAt: t0, fp: "x",
			resp: idempotency.Response{Status: -1, Header: map[string][]string{}, Body: []byte{}}},
		{state: stateDone, token: 9, expiresAt: t0, fp: "y",
			resp: idempotency.Response{Status: 200, Header: map[string][]string{
				"Content-Type": {"application/json"},
				"Set-Cookie":   {"a=1", "b=2", ""},
				"X-Empty":      {},
				"X-Nil":        nil,
			}, Body: []byte{0, 1, 2, 255}}},
	}
}

var recCmp = cmp.AllowUnexported(rec{})

func TestCodecRoundTrip(t *testing.T) {
	for i, r := range codecSamples() {
		got, err := decode(encode(nil, &r))
		if err != nil {
			t.Fatalf("sample %d: decode(encode(%+v)): %v", i, r, err)
		}
		if diff := cmp.Diff(r, got, recCmp); diff != "" {
			t.Errorf("sample %d: round trip changed the record (-want +got):\n%s", i, diff)
		}
	}
}

func TestCodecRejects(t *testing.T) {
	good := encode(nil, &codecSamples()[4])
	cases := map[string][]byte{
		"empty":          nil,
		"version 0":      {0, stateProcessing, 1, 0, 0, 0},
		"version 2":      append([]byte{2}, good[1:]...),
		"unknown state":  {codecV1, 3, 1, 0, 0, 0},
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"fp too long":    {codecV1, stateProcessing, 1, 0, 0, 5, 'a'},
		"body count":     {codecV1, stateDone, 1, 0, 0, 0, 0, 0, 200, 1},
		"header count":   {codecV1, stateDone, 1, 0, 0, 0, 0, 100, 0},
		"bad varint":     {codecV1, stateProcessing, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"duplicate header": {codecV1, stateDone, 1, 0, 0, 0, 0,
			3, 1, 'a', 0, 1, 'a', 0, 0},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := decode(b)
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("decode(%x) = %+v, %v; want an error wrapping errCorrupt", b, r, err)
			}
		})
	}
}

// The decoded record must not alias the input, which may be bbolt's mmap.
func TestCodecCopies(t *testing.T) {
	r := codecSamples()[4]
	b := encode(nil, &r)
	got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0xAA
	}
	if diff := cmp.Diff(r, got, recCmp); diff != "" {
		t.Errorf("decoded record changed with its input (-want +got):\n%s", diff)
	}
}

// FuzzDecode checks that decode never panics and that whatever it accepts
// survives another round of encoding unchanged.
func FuzzDecode(f *testing.F) {
	for _, r := range codecSamples() {
		f.Add(encode(nil, &r))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decode(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("decode error %v does not wrap errCorrupt", err)
			}
			return
		}
		if at, err := expiryOf(b); err != nil || at != r.expiresAt {
			t.Fatalf("expiryOf = %d, %v; decode gave %d", at, err, r.expiresAt)
		}
		again, err := decode(encode(nil, &r))
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", r, err)
		}
		if diff := cmp.Diff(r, again, recCmp); diff != "" {
			t.Fatalf("round trip changed the record (-first +second):\n%s", diff)
		}
	})
}
