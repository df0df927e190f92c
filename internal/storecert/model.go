package storecert

import (
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/archlab/idempotency"
)

// tolerance is how far a stored time may be from the one asked for (engines
// may store milliseconds), as in idemtest.
const tolerance = int64(time.Millisecond)

// mstate is the model of one key: absent, or a Processing claim (token,
// fingerprint, lease) or a Done result (fingerprint, response). Leases are
// intervals [leaseLo, leaseHi], since when a server clock judges them we
// only know between which instants a claim or a renewal took effect. token
// 0 is a token the model has not seen: that of a claim made by a Begin whose
// answer was lost. maxToken is the largest token seen for the key: every
// new claim must exceed it (fencing), whatever the state. Windows are not
// modelled: the campaign's retention outlasts it.
type mstate struct {
	present          bool
	state            idempotency.State
	fp               string
	token            uint64
	maxToken         uint64
	leaseLo, leaseHi int64
	body             string
}

func addSat(a int64, d time.Duration) int64 {
	if a > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return a + int64(d)
}

// livePossible and expiredPossible saturate: an unknown call's lease on
// the server's clock ends at MaxInt64, and MaxInt64+tolerance would wrap
// to a negative instant that no lease is live before.
func (s mstate) livePossible(in input) bool {
	return in.nowLo < addSat(s.leaseHi, time.Duration(tolerance))
}
func (s mstate) expiredPossible(in input) bool { return in.nowHi >= s.leaseLo-tolerance }

// holds reports whether token may name the current claim.
func (s mstate) holds(token uint64) bool {
	return s.present && s.state == idempotency.Processing &&
		(token == s.token || (s.token == 0 && token > s.maxToken))
}

func (s mstate) leased(in input) mstate {
	s.leaseLo, s.leaseHi = addSat(in.nowLo, in.lease), addSat(in.nowHi, in.lease)
	return s
}

// step returns every state the key may be in after the call, none if the
// call's answer is impossible from s.
func step(s mstate, in input, out output) []mstate {
	if out.unknown {
		next := []mstate{s} // not applied
		if a, ok := applied(s, in); ok {
			next = append(next, a)
		}
		return next
	}
	switch in.kind {
	case opBegin:
		return stepBegin(s, in, out)
	case opComplete:
		if out.err == errLeaseLost {
			if s.present && s.state == idempotency.Processing && s.token != 0 && s.token == in.token {
				return nil
			}
			return []mstate{s}
		}
		if out.err != errNone || !s.holds(in.token) {
			return nil
		}
		return []mstate{completed(s, in)}
	case opExtend, opRelease:
		if out.err == errLeaseLost {
			if s.present && s.state == idempotency.Processing && s.token != 0 && s.token == in.token {
				return nil
			}
			return []mstate{s}
		}
		if out.err != errNone || !s.holds(in.token) {
			return nil
		}
		a, _ := applied(s, in)
		return []mstate{a}
	case opGet:
		if out.err == errNotFound {
			if s.present {
				return nil
			}
			return []mstate{s}
		}
		return answered(s, in, out)
	case opDelete:
		if out.err != errNone {
			return nil
		}
		a, _ := applied(s, in)
		return []mstate{a}
	}
	return nil
}

func completed(s mstate, in input) mstate {
	s.state, s.body, s.token = idempotency.Done, in.body, in.token
	s.maxToken = max(s.maxToken, in.token)
	s.leaseLo, s.leaseHi = 0, 0
	return s
}

// applied returns the state after the call took effect, if it can change
// anything from s.
func applied(s mstate, in input) (mstate, bool) {
	switch in.kind {
	case opBegin:
		switch {
		case !s.present:
			n := mstate{present: true, state: idempotency.Processing, fp: in.fp, maxToken: s.maxToken}
			return n.leased(in), true
		case s.state == idempotency.Processing && s.fp == in.fp && s.expiredPossible(in):
			s.token = 0 // a takeover with a token we have not seen
			return s.leased(in), true
		}
	case opComplete:
		if s.holds(in.token) {
			return completed(s, in), true
		}
	case opExtend:
		if s.holds(in.token) {
			s.token = in.token
			s.maxToken = max(s.maxToken, in.token)
			return s.leased(in), true
		}
	case opRelease:
		if s.holds(in.token) {
			return mstate{maxToken: max(s.maxToken, in.token)}, true
		}
	case opDelete:
		if s.present {
			return mstate{maxToken: s.maxToken}, true
		}
	}
	return s, false
}

func stepBegin(s mstate, in input, out output) []mstate {
	if out.err != errNone {
		return nil
	}
	if out.claimed {
		if out.state != idempotency.Processing || out.fp != in.fp || out.token <= s.maxToken {
			return nil
		}
		if s.present && !(s.state == idempotency.Processing && s.fp == in.fp && s.expiredPossible(in)) {
			return nil
		}
		n := mstate{present: true, state: idempotency.Processing, fp: in.fp, token: out.token, maxToken: out.token}
		if out.leaseUntil != 0 {
			n.leaseLo, n.leaseHi = out.leaseUntil-tolerance, out.leaseUntil+tolerance
		} else {
			n = n.leased(in)
		}
		return []mstate{n}
	}
	if !s.present {
		return nil
	}
	switch out.state {
	case idempotency.Conflict:
		if s.fp == in.fp {
			return nil
		}
		return []mstate{s}
	case idempotency.Done, idempotency.Processing:
		if s.fp != in.fp {
			return nil
		}
		if out.state == idempotency.Processing && !s.livePossible(in) {
			return nil
		}
		return answered(s, in, out)
	}
	return nil
}

// answered checks a record the store showed (an in-flight or replay answer
// of Begin, or Get) against s, learning an unseen token.
func answered(s mstate, _ input, out output) []mstate {
	if !s.present || out.state != s.state || out.fp != s.fp {
		return nil
	}
	if s.state == idempotency.Done {
		// Stores need not return the token of a replayed record.
		if out.body != s.body {
			return nil
		}
		return []mstate{s}
	}
	switch {
	case s.token == 0 && out.token > s.maxToken:
		s.token, s.maxToken = out.token, out.token
	case s.token != out.token:
		return nil
	}
	return []mstate{s}
}

// model is the sequential specification of one key's record.
func model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{mstate{}} },
		Step: func(state, in, out any) []any {
			next := step(state.(mstate), in.(input), out.(output))
			res := make([]any, len(next))
			for i, n := range next {
				res[i] = n
			}
			return res
		},
		DescribeOperation: func(in, out any) string {
			return fmt.Sprintf("%v → %v", in, out)
		},
		DescribeState: func(state any) string {
			s := state.(mstate)
			tok := fmt.Sprint(s.token)
			if s.token == 0 {
				tok = "?"
			}
			switch {
			case !s.present:
				return fmt.Sprintf("absent (max token %d)", s.maxToken)
			case s.state == idempotency.Done:
				return fmt.Sprintf("Done fp=%s token=%s %q", s.fp, tok, s.body)
			}
			return fmt.Sprintf("Processing fp=%s token=%s (max %d)", s.fp, tok, s.maxToken)
		},
	}
	return nm.ToModel()
}

// keyResult is the verdict on one key's history.
type keyResult struct {
	key    string
	ops    int
	result porcupine.CheckResult
	// viz is the path of porcupine's visualization of an illegal history
	// ("": none written); vizErr, why it could not be written.
	viz    string
	vizErr error
}

// checkHistory checks the history of each key for linearizability against
// the model, each within timeout and all by deadline (keys left over are
// Unknown). A history that is not linearizable is drawn to an HTML file in
// dir ("": it is not drawn).
func checkHistory(ops []op, timeout time.Duration, deadline time.Time, dir string) []keyResult {
	byKey := map[string][]porcupine.Operation{}
	for _, o := range ops {
		byKey[o.in.key] = append(byKey[o.in.key], porcupine.Operation{
			ClientId: o.client, Input: o.in, Output: o.out, Call: o.call, Return: o.ret})
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	m := model()
	var out []keyResult
	for _, k := range keys {
		h := byKey[k]
		if time.Now().After(deadline) {
			out = append(out, keyResult{key: k, ops: len(h), result: porcupine.Unknown})
			continue
		}
		res, info := porcupine.CheckOperationsVerbose(m, h, timeout)
		kr := keyResult{key: k, ops: len(h), result: res}
		if res == porcupine.Illegal && dir != "" {
			kr.viz, kr.vizErr = visualize(m, info, dir)
		}
		out = append(out, kr)
	}
	return out
}

// visualize writes porcupine's visualization of info to a new HTML file in
// dir and returns its path.
func visualize(m porcupine.Model, info porcupine.LinearizationInfo, dir string) (string, error) {
	f, err := os.CreateTemp(dir, "storecert-history-*.html")
	if err != nil {
		return "", err
	}
	err = porcupine.Visualize(m, info, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}
