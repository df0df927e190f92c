package blackbox

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// pooled answers with the name of the node that served the request and the
// request itself, nothing unique to the execution: keys are routed to a
// small pool of nodes (each new caller and key to the next node in turn,
// and the same one after), so that two executions of one body answer
// differently for some keys and alike for others. It keeps fingerprints
// (another body on a used key is answered 422) but no results: every
// request runs, and a retry answers the same bytes as the first answer.
type pooled struct {
	nodes int
	runs  atomic.Int64

	mu    sync.Mutex
	route map[string]int      // caller and key: node
	fps   map[string][32]byte // caller and key: the body's fingerprint
}

func (s *pooled) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _, fp, body, ok := toyRequest(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	if s.route == nil {
		s.route, s.fps = map[string]int{}, map[string][32]byte{}
	}
	node, seen := s.route[id]
	if !seen {
		node = len(s.route) % s.nodes
		s.route[id], s.fps[id] = node, fp
	}
	other := seen && s.fps[id] != fp
	s.mu.Unlock()
	if other {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
		return
	}
	s.runs.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"node":"n%d","request":%s}`, node, body)
}

// Whether the answers identify executions is judged on every answer to
// one body under fresh keys, not on two: a target whose first two such
// answers differ (two nodes) and a later one repeats an earlier one runs
// every request, and nothing else in the run can see it.
func TestIdentifiesJudgedOnEveryAnswer(t *testing.T) {
	for _, nodes := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			s := &pooled{nodes: nodes}
			rep := run(t, testConfig(serve(t, s)))
			if rep.OK() {
				t.Errorf("the report passed a target that ran every one of %d requests", s.runs.Load())
			}
			if !containsName(failed(rep), CheckVisible) {
				t.Errorf("%q held for a target whose answers repeat across executions; failed: %v", CheckVisible, failed(rep))
			}
		})
	}
}
