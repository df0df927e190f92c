// Package blackbox is idemcheck's black-box mode: it checks, from the
// outside, that an HTTP endpoint claiming Idempotency-Key support really
// runs each keyed request at most once and replays its first answer.
//
// Run sends JSON POSTs to Config.Target, each logical request with a fresh
// key and a body rendered from Config.BodyTemplate ({{unique}} becomes a
// value unique to the run and the request, {{seq}} its sequence number), and
// records what it sees in a verdict.Report under these checks:
//
//   - CheckFresh: a fresh key with a valid body gets a 2xx. Not a property of
//     idempotency, but without it the others cannot be judged.
//   - CheckRetry: the same key and body sent again, after a 2xx first
//     answer arrived, gets the same answer: status, body, media type and
//     Location. (A refusal repeated proves no replay, and may rightly not
//     be stored; CheckFresh has it.)
//     Each key is sent once more at the end of the run, Config.Window
//     after its first answer, and must still get it. A 409 (in flight) to
//     a retry is waited out, as a client would (a target may answer before
//     it stores the result; see "Waiting, and how long a run lasts").
//     Where the target's answers do not identify executions (below), only
//     a retry marked as a replay counts; with none, the check is skipped
//     with the reason.
//   - CheckMarked: replays carry Idempotent-Replayed: true and first answers
//     do not. The draft does not require the header, so a target that never
//     sends it gets a skip with the reason, not a failure; one that sends it
//     on some replays only, or on a first answer, fails.
//   - CheckConcurrent: Config.Concurrency requests with one key, released
//     together, yield at most one distinct 2xx answer; the others are
//     replays of it or 409 (in flight). Two 2xx bodies mean two executions;
//     one body under two statuses means a duplicate did not get the first
//     answer. A later retry replays that answer. A target that marks its
//     replays answers at most one duplicate 2xx unmarked: more are more
//     executions, even under one body (answers that do not identify
//     executions, or runners that all answer the first stored result).
//   - CheckApart: requests on different keys sent at once (up to eight, in
//     a few rounds) each get an answer of their own, not another key's,
//     and their retries, also sent at once, each replay their own key's
//     first answer. A target right one request at a time may still mix
//     up keys that run together (a result kept through a buffer or a
//     field that requests share). Skipped like CheckConcurrent where
//     answers do not identify executions and replays are not marked.
//   - CheckPayload: the same key with another body gets Config.ConflictStatus
//     (422 unless set).
//   - CheckMalformed: malformed Idempotency-Key values (empty, a list,
//     parameters, a broken sf-string, 256 characters, a control character)
//     get 400, and a valid request with a fresh key still works after them.
//   - CheckLost: a request whose answer is lost on the way back is followed
//     by a retry that replays it rather than runs again. The answer is lost
//     in three ways, in turn, on raw connections: closed as soon as the
//     request is written; closed (with a reset) once the status line came;
//     and half-closed after the request, so that the target sees its client
//     leave while it runs, with the answer read all the same for comparison.
//   - CheckScope: the same key under Config.Headers[0] and [1] (two
//     credential sets) never gives one caller the other's result: neither
//     gets the other's body, under any status, and the first caller's
//     retry replays its own answer. The second caller's request may run
//     for it, independently (keys scoped per caller; its retry must then
//     replay its own answer, as a target may claim keys per caller but
//     keep results per key), or be refused with 422 or 409 (keys global,
//     their reuse by another caller refused): nothing is shared and
//     nothing runs twice, so that passes, with the note "refused
//     cross-caller reuse" in the report, and the second caller's retry
//     must still not get the first caller's result (once per run, a 409 to
//     that retry is waited out for up to Config.Timeout: in flight may yet
//     turn into a replay), and a fresh key of the second caller's own must
//     run (2xx). Any other answer to the second caller fails. Skipped with
//     one credential set.
//   - CheckVisible: the target's answers identify executions, or it marks
//     its replays. Without either, no check could have seen an operation
//     run twice (a target that runs every request would pass them all), so
//     the run fails here rather than pass on skips. Skipped when the
//     fresh requests that find it out were not all answered 2xx (so
//     CheckFresh failed), no two of those that were came alike, and no
//     replay was marked.
//   - CheckExecutions, only with Config.Executions: the executions the
//     target's own counter shows for the run are at most the operations
//     (a caller, a key and a body) that may have run: all but those
//     answered only the refusals the run asks for, which the draft gives
//     a request that is not run (400 to a malformed key,
//     Config.ConflictStatus to another body on a key in use, 409 or 422
//     to a second caller's use of a key). Another 4xx does not say the
//     operation did not run (a target may run it and then refuse it, a
//     business rule checked after an audit row), nor does a 4xx marked as
//     a replay (a stored result). One bound for the run, not per key, and
//     loose by each operation whose outcome is unknown (a lost request, a
//     4xx the run did not ask for) that did not run; nothing else may run
//     the target's operation meanwhile.
//
// # What a black box can see
//
// Double execution is visible only in the responses. Run tells two
// executions apart by their bodies and Location fields, so the target must
// answer something unique per execution, as a created resource's id is.
// Before the checks Run sends one body under four fresh keys; if any two
// answers are identical once each is rid of its own key (an answer that
// only echoes the key, a resource named after it, is the same bytes
// however often the key runs; one that names the node or shard that
// served it, from a small pool, repeats from some execution to another),
// the target's responses do not identify executions: CheckScope is
// skipped with that reason, CheckConcurrent too unless the target marks
// replays, CheckLost compares no answers and CheckRetry counts only
// marked replays. A server that runs a request
// twice and answers the same bytes both times cannot be caught this way;
// nor can one that runs a duplicate and then answers it 409 (a claim
// stored after the side effect, refused as a duplicate), or with the
// first stored result marked as a replay; nor one that runs a request,
// sees its client gone and drops the connection without storing anything,
// so that the retry runs it again (a target may rightly refuse such a
// request unrun). The target's execution counter, Config.Executions, shows
// all of these.
//
// Only the key itself is taken out of the answers before they are
// compared. An answer derived from the key in another way (a digest of
// it, a UUIDv5, a resource named after it in another encoding) differs
// from key to key as a unique id would, and is taken for one: a target
// that derives its ids from the key, claims nothing and marks no replays
// runs concurrent duplicates and retries unseen, and passes every check,
// CheckVisible included. Nothing outside the target can tell its answers
// from those of a correct one; only its own records can (as the demo's
// ledger does, and Config.Executions may).
//
// A lost response is never seen by the client it was meant for, so the
// retry after it is judged by what can be known. After a half-close the
// answer the target gave is read anyway and, if it is a 2xx, the retry
// must equal it. After a 2xx status line the request is known to have
// run, so the retry must be marked Idempotent-Replayed if CheckRetry
// showed that the target marks its replays. A retry marked as a replay
// must be the answer that was seen: the whole answer after a half-close,
// the status after a cut (a target that keeps "client closed request" for
// a request it ran, and replays that, tells its client nothing was done).
// Other answers do not show that the request ran (a target may refuse a client that has gone, with
// 499 or 408, or turn it away with 429), so the retry may rightly run
// it. After a close right after sending, the target may rightly not
// run the request at all (it may see the client gone first, as idemhttp
// does when its store refuses a cancelled request), so an unmarked retry
// proves nothing, even after a 409: the lost request held the key, but it
// may have been abandoned, or run and forgotten, before the retry ran
// again. Only a marked replay counts as held. Retries that cannot be
// judged are left out; if none can, the check is skipped with the reason.
//
// Keys and unique values hold a random run id, so that runs against a
// server that keeps its records never collide; Config.Seed drives the rest
// (the order of the malformed keys, the values' random part), so a run is
// repeatable apart from the run id.
//
// # Waiting, and how long a run lasts
//
// A retry answered 409 (in flight) is sent again every 50ms for up to
// Config.Timeout, and judged by the first other answer. A key still 409
// after that fails the check that sent it; since the run has then failed,
// later retries are not waited out, so that a target that answers 409 for
// ever holds the run for one timeout, not one per key.
//
// A run is bounded by its Config: it takes each of the Config.Requests keys
// of a check through a fixed number of exchanges (about twelve in all, in
// sequence, beside the Config.Concurrency duplicates sent at once and the
// keys CheckApart sends together), each
// bounded by Config.Timeout, and each retry answered 409 waits at most
// Config.Timeout more; the last retries come at most Config.Window after
// the first answers. Against a prompt target that is a few seconds plus
// Config.Window. A target that stops answering ends the run sooner: once
// every exchange has failed, with no answer between, for three timeouts,
// Run stops and returns an error saying so.
//
// Run returns an error only when checking is impossible: an invalid Config,
// a target that cannot be reached at all, one that stopped answering, or
// an execution counter that cannot be read at the start.
// Everything the target does wrong goes into the report.
package blackbox
