// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Calls wait in a queue for a worker. The worker takes everything waiting and sends
// it in one pipeline: one apply script that returns the refunds waiting and then
// decides the reservations waiting, in arrival order, each all or nothing; and one
// charge script per overage. A reservation is still decided by one script in one
// round trip; under load many share it, so each key is read and written once per
// pipeline rather than once per request, and Redis spends its time deciding rather
// than parsing and writing.
//
// Refunds do not go on their own at once: they gather, merged bucket by bucket, for up
// to Options.RefundLinger (1ms), and the next pipeline takes them, so a refund usually
// rides with a reservation and costs neither a call nor a round trip. A refund is
// applied before the reservations in its call, so gathering never makes a reservation
// see less budget than it would have. Nobody waits for a refund but a stopping proxy:
// a settlement hands it over and goes on (SendRefund).

type callKind uint8

const (
	reserveCall callKind = iota
	refundCall
	chargeCall
)

// call is one reservation, charge, or batch of refunds waiting for a pipeline.
type call struct {
	kind        callKind
	reservation *budget.Reservation
	charges     []budget.Charge
	overage     budget.Overage
	refunds     *refunds
	// group is the slot group of a reservation or a charge (0 on one server).
	group int
	done  chan reply
}

// reply is a call's part of its script's reply, or the error that kept it from Redis.
type reply struct {
	val any
	err error
}

const (
	// callQueue bounds the calls waiting for Redis. Beyond it a reservation is
	// answered as unavailable and a settlement is dropped (its budget returns at the
	// refill rate) rather than blocking anything.
	callQueue = 4096
	// pipelineWorkers send the queued calls; each waits for its pipeline's replies.
	// While one pipeline is answered the next fills, so one worker still overlaps the
	// round trip with the requests arriving, and sends pipelines twice as large as two
	// workers do: in BenchmarkProxy (loopback, 64 connections, fifteen buckets) Redis
	// spent 10.7 to 14.1 µs of CPU per request with one worker against 17.0 to 18.3
	// with two (0.12 to 0.16 script calls per request against 0.20 to 0.27), and the
	// proxy process no more. More workers make smaller pipelines still (four: 5% less
	// throughput than two). The price is latency where callers do nothing but wait for
	// Redis: BenchmarkLayouts/single (64 goroutines reserving and settling) admits 9 to
	// 12% fewer a second with one worker. A second worker that waits for the first's
	// pipeline unless it holds 16 calls recovered a third of that and cost the proxy
	// Redis CPU (15.4 to 15.7 µs a request against 9.7 to 13.9), so it was not kept.
	// This is per queue: on a cluster each master has its own queue and worker
	// (queues.go), so a master that fails or stalls delays only its own calls. In
	// BenchmarkLayouts/cluster (shared host, six runs each, alternated) the queue per
	// master made 7.8 to 7.9 script calls per request (8.4 in the most loaded run)
	// against 7.1 to 7.6 with one queue (each master's worker sends as soon as it is
	// free, so its pipelines are a little smaller), at the same throughput (3,911 to
	// 6,292 admissions a second against 3,846 to 4,351 in the three quieter pairs) and
	// Redis time per request (109 to 126 µs against 110 to 125); one server was
	// unchanged (10,131 to 16,488 against 10,578 to 15,908 outside the most loaded runs).
	pipelineWorkers = 1
	// maxPipeline bounds the calls one worker takes at once.
	maxPipeline = 64
)

var (
	errQueueFull = errors.New("redis: too many calls waiting")
	errClosed    = errors.New("redis: the store is closed")
)

// replyChans recycles the reply channels of run: a worker sends exactly one reply on
// a call's channel, so once run has received it the channel is empty and unused.
var replyChans = sync.Pool{New: func() any { return make(chan reply, 1) }}

// run queues a call for the pipeline workers and waits for its reply.
func (s *Store) run(c call) reply {
	done := replyChans.Get().(chan reply)
	c.done = done
	q := s.queueOf(c.group)
	if q == nil {
		replyChans.Put(done)
		return reply{err: errClosed}
	}
	if err := s.enqueue(q, c); err != nil {
		replyChans.Put(done)
		return reply{err: err}
	}
	// Always wait for the reply, even for a caller that went away: a reservation the
	// worker made must reach the caller, whose hold then releases it.
	select {
	case r := <-done:
		replyChans.Put(done)
		return r
	case <-s.stopped:
		select {
		case r := <-done:
			replyChans.Put(done)
			return r
		default:
			// A worker may still answer: the channel is not reused.
			return reply{err: errClosed}
		}
	}
}

func (s *Store) enqueue(q *queue, c call) error {
	select {
	case <-s.done:
		return errClosed
	default:
	}
	select {
	case q.calls <- c:
		return nil
	default:
		return errQueueFull
	}
}

// refunds are gathered refunds, one amount per bucket and recorded parameters.
type refunds struct {
	// n is the number of refunds gathered.
	n int
	// entries are the buckets refunded, in the order first seen, with their amounts;
	// at indexes them once there are more than a scan should look through (nil
	// until then).
	entries []refundEntry
	at      map[refundBucket]int
	// done closes when the refunds were applied, or could not be (err).
	done chan struct{}
	err  error
	// senders are the wait groups of the refunds sent without waiting (SendRefund),
	// each with the count it was added; finish marks them done.
	senders []sender
}

// sender is a wait group of SendRefund's callers and what it was added for one
// gathering.
type sender struct {
	wg *sync.WaitGroup
	n  int
}

// refundBucket identifies a bucket and the parameters a hold recorded on it: refunds
// merge when both match.
type refundBucket struct {
	key            budget.Key
	capacity, rate float64
}

func (r *refunds) finish(err error) {
	r.err = err
	close(r.done)
	for _, w := range r.senders {
		w.wg.Add(-w.n)
	}
}

// sentBy counts one refund of the gathering pending on wg (q.refundMu held).
func (r *refunds) sentBy(wg *sync.WaitGroup) {
	wg.Add(1)
	if n := len(r.senders); n > 0 && r.senders[n-1].wg == wg {
		r.senders[n-1].n++
		return
	}
	r.senders = append(r.senders, sender{wg: wg, n: 1})
}

// gather adds a refund to the refunds gathering for queue q, starting them if none
// are, and returns them; the refund is pending on wg, when not nil, until they are
// applied or given up.
func (s *Store) gather(q *queue, charges []budget.Charge, wg *sync.WaitGroup) *refunds {
	q.refundMu.Lock()
	defer q.refundMu.Unlock()
	r := q.gathering
	if r == nil {
		r = newRefunds(len(charges))
		q.gathering = r
		time.AfterFunc(s.linger, func() { s.sendRefunds(q, r) })
	}
	r.add(charges)
	if wg != nil {
		r.sentBy(wg)
	}
	return r
}

// add gathers one refund. A hold's buckets come in the order its policy lists them,
// so a refund's buckets are mostly where the refund before it put them: each is
// looked for there first, and elsewhere only when it is not.
func (r *refunds) add(charges []budget.Charge) {
	r.n++
	for j, ch := range charges {
		b := refundBucket{key: ch.Key, capacity: ch.SharedCapacity, rate: ch.SharedRate}
		i := j
		if j >= len(r.entries) || r.entries[j].refundBucket != b {
			i = r.find(b)
		}
		if i >= 0 {
			r.entries[i].amount += ch.Amount
			continue
		}
		if r.at != nil {
			r.at[b] = len(r.entries)
		}
		r.entries = append(r.entries, refundEntry{refundBucket: b, amount: ch.Amount})
	}
}

// find is the index of b's entry, or -1: a scan of a few entries, or a lookup in the
// index, made once there are more.
func (r *refunds) find(b refundBucket) int {
	if r.at == nil {
		if len(r.entries) <= 32 {
			for i := range r.entries {
				if r.entries[i].refundBucket == b {
					return i
				}
			}
			return -1
		}
		r.at = make(map[refundBucket]int, 2*len(r.entries))
		for i, e := range r.entries {
			r.at[e.refundBucket] = i
		}
	}
	if i, ok := r.at[b]; ok {
		return i
	}
	return -1
}

func newRefunds(buckets int) *refunds {
	return &refunds{entries: make([]refundEntry, 0, buckets), done: make(chan struct{})}
}

// refundsOf is one refund on its own, for a pipeline to send.
func (s *Store) refundsOf(charges []budget.Charge) *refunds {
	r := newRefunds(len(charges))
	r.add(charges)
	return r
}

// takeRefunds ends the gathering for queue q and returns what gathered, or nil.
func (q *queue) takeRefunds() *refunds {
	q.refundMu.Lock()
	defer q.refundMu.Unlock()
	r := q.gathering
	q.gathering = nil
	return r
}

// sendRefunds queues refunds that no pipeline took within the linger.
func (s *Store) sendRefunds(q *queue, r *refunds) {
	q.refundMu.Lock()
	mine := q.gathering == r
	if mine {
		q.gathering = nil
	}
	q.refundMu.Unlock()
	if !mine {
		return // a pipeline took them
	}
	// Under the queues' lock, so that Close, which drains the queues once their workers
	// stop, either finds the call or comes before it: a refund is always finished.
	s.q.mu.Lock()
	err := errClosed
	if !s.q.closed {
		err = s.enqueue(q, call{kind: refundCall, refunds: r, done: make(chan reply, 1)})
	}
	s.q.mu.Unlock()
	if err != nil {
		s.log.Debug("Refunds could not reach Redis; their budget returns at the refill rate", "refunds", r.n, "error", err)
		r.finish(err)
	}
}

// pipeline sends the calls queued in q, as many as are waiting, in one pipeline.
func (s *Store) pipeline(q *queue) {
	defer s.workers.Done()
	batch := make([]call, 0, maxPipeline)
	for {
		select {
		case <-s.done:
			return
		case c := <-q.calls:
			batch = append(batch[:0], c)
		}
		// Let the goroutines that are ready run first: under load some of them are
		// about to queue calls, which then share this pipeline instead of waiting for
		// the next. When nothing else is ready this returns at once.
		runtime.Gosched()
	drain:
		for len(batch) < maxPipeline {
			select {
			case c := <-q.calls:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		q.sending.Add(int64(len(batch)))
		err := s.send(q, batch)
		q.sending.Add(-int64(len(batch)))
		if err != nil && (q.node != "" || !s.sharded) {
			s.failQueued(q, err)
		}
	}
}

// failQueued answers with err, the failure of the pipeline before them, the calls
// waiting in q: they go to the server that just failed to answer, and each would wait
// for a timeout of its own after the one it waited behind. A reservation goes to the
// fallback at once, as it would after its own timeout.
func (s *Store) failQueued(q *queue, err error) {
	for {
		select {
		case c := <-q.calls:
			if c.kind == refundCall {
				c.refunds.finish(err)
			}
			c.done <- reply{err: err}
		default:
			return
		}
	}
}

// send sends one batch of queue q, with the refunds gathering for q, and answers each
// of its calls. It returns the pipeline's error when the pipeline got no answer (a
// timeout, a connection refused or reset).
func (s *Store) send(q *queue, batch []call) (failed error) {
	ctx := context.Background()
	var gathered []*refunds
	if r := q.takeRefunds(); r != nil {
		gathered = append(gathered, r)
	}
	var charges []call
	reserves := 0
	for _, c := range batch {
		switch c.kind {
		case reserveCall:
			reserves++
		case refundCall:
			gathered = append(gathered, c.refunds)
		case chargeCall:
			charges = append(charges, c)
		}
	}

	type sent struct {
		script *redis.Script
		keys   []string
		args   []any
		cmd    *redis.Cmd
	}
	var calls []sent
	// One apply call per slot group (one on a single server) carries the group's
	// refunds and reservations; refunds beyond what one call should carry go first, in
	// calls of their own.
	groups, groupAt := s.byGroup(mergeRefunds(gathered), batch)
	for i := range groups {
		gc := &groups[i]
		refund := gc.refund
		for len(refund) > maxApplyRefunds {
			k, a, _ := s.apply(gc.g, refund[:maxApplyRefunds], nil)
			calls = append(calls, sent{script: applyScript, keys: k, args: a})
			refund = refund[maxApplyRefunds:]
		}
		if len(refund) > 0 || len(gc.reserves) > 0 {
			k, a, sum := s.apply(gc.g, refund, gc.reserves)
			gc.call, gc.sum = len(calls), sum
			calls = append(calls, sent{script: applyScript, keys: k, args: a})
		}
	}
	for _, c := range charges {
		p := newSpec(len(c.charges))
		for _, ch := range c.charges {
			p.add(s, ch.Key, ch.SharedCapacity, ch.SharedRate, ch.Amount)
		}
		calls = append(calls, sent{script: chargeScript, keys: p.keys, args: []any{p.buf, c.overage.String()}})
	}

	pipe := s.c.Pipeline()
	for i := range calls {
		calls[i].cmd = calls[i].script.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	start := time.Now()
	_, err := pipe.Exec(ctx)
	if failedOnConn(err) {
		failed = err
	}
	if err != nil && anyNoScript(calls, func(c sent) error { return c.cmd.Err() }) {
		// Redis restarted, failed over, or its scripts were flushed: load them and send
		// again the calls that found no script, and only those (another may have run).
		if err = applyScript.Load(ctx, s.c).Err(); err == nil {
			err = chargeScript.Load(ctx, s.c).Err()
		}
		if err == nil {
			retry := s.c.Pipeline()
			for i, c := range calls {
				if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
					calls[i].cmd = c.script.EvalSha(ctx, retry, c.keys, c.args...)
				}
			}
			_, _ = retry.Exec(ctx)
		}
	}
	refunded := 0
	for _, r := range gathered {
		refunded += r.n
	}
	s.rec.RedisPipeline(time.Since(start), reserves, refunded, len(charges))

	// The apply calls come before the charges; a refund's error is the first of theirs.
	var refundErr error
	for _, c := range calls[:len(calls)-len(charges)] {
		if err := c.cmd.Err(); err != nil {
			refundErr = err
			break
		}
	}
	if refundErr != nil && refunded > 0 {
		s.log.Debug("Refunds could not reach Redis; their budget returns at the refill rate", "refunds", refunded, "error", refundErr)
	}
	for _, r := range gathered {
		r.finish(refundErr)
	}
	// Each group's decisions answer its reservations, in the order they were taken.
	for i := range groups {
		gc := &groups[i]
		if len(gc.reserves) == 0 {
			continue
		}
		decided, err := calls[gc.call].cmd.Slice()
		if err == nil {
			decided, err = gc.sum.decisions(decided, gc.reserves)
		}
		if err == nil && len(decided) != len(gc.reserves) {
			err = fmt.Errorf("redis apply script: %d decisions for %d reservations", len(decided), len(gc.reserves))
		}
		gc.decided, gc.err = decided, err
	}
	for _, c := range batch {
		switch c.kind {
		case refundCall:
			c.done <- reply{err: refundErr}
		case reserveCall:
			gc := &groups[0]
			if groupAt != nil {
				gc = &groups[groupAt[c.group]]
			}
			if gc.err != nil {
				c.done <- reply{err: gc.err}
				continue
			}
			c.done <- reply{val: gc.decided[gc.next]}
			gc.next++
		}
	}
	for i, c := range charges {
		val, err := calls[len(calls)-len(charges)+i].cmd.Result()
		c.done <- reply{val: val, err: err}
	}
	// Every call is answered: the next pipeline lays out its calls in their memory.
	for _, gc := range groups {
		if gc.sum != nil {
			gc.sum.release()
		}
	}
	return failed
}

// anyNoScript tells whether a call found no script.
func anyNoScript[T any](calls []T, err func(T) error) bool {
	for _, c := range calls {
		if redis.HasErrorPrefix(err(c), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// groupCalls are one slot group's refunds and reservations in a pipeline, and then
// its apply call and decisions.
type groupCalls struct {
	g        int
	refund   []refundEntry
	reserves []*budget.Reservation
	// call is the index of the apply call deciding reserves, and sum its batch sum.
	call int
	sum  *batchSum
	// decided answers reserves in order (next is the next to answer), or err all.
	decided []any
	err     error
	next    int
}

// byGroup sorts a pipeline's refunds and reservations by slot group, in the order
// first seen; at is a group's index in groups, nil on one server where everything is
// group 0 and groups has at most one.
func (s *Store) byGroup(refund []refundEntry, batch []call) (groups []groupCalls, at map[int]int) {
	if !s.sharded {
		// One server: the refunds go as merged.
		var rs []*budget.Reservation
		for _, c := range batch {
			if c.kind == reserveCall {
				if rs == nil {
					rs = make([]*budget.Reservation, 0, len(batch))
				}
				rs = append(rs, c.reservation)
			}
		}
		if len(refund) == 0 && len(rs) == 0 {
			return nil, nil
		}
		return []groupCalls{{refund: refund, reserves: rs}}, nil
	}
	at = map[int]int{}
	see := func(g int) *groupCalls {
		i, ok := at[g]
		if !ok {
			i = len(groups)
			at[g] = i
			groups = append(groups, groupCalls{g: g})
		}
		return &groups[i]
	}
	for _, e := range refund {
		gc := see(groupOf(e.key))
		gc.refund = append(gc.refund, e)
	}
	for _, c := range batch {
		if c.kind == reserveCall {
			gc := see(c.group)
			gc.reserves = append(gc.reserves, c.reservation)
		}
	}
	return groups, at
}

// maxApplyRefunds bounds the refunded buckets in one apply call, so that one call never
// names more keys than Lua can unpack (about 8,000) or the spec can index (65,535),
// however many refunds gathered while Redis was slow.
const maxApplyRefunds = 1024

// refundEntry is one bucket's merged refund.
type refundEntry struct {
	refundBucket
	amount float64
}

// mergeRefunds merges gathered refunds bucket by bucket, in the order first seen.
// Refunds taken are no longer gathering, so one alone is returned as it is.
func mergeRefunds(gathered []*refunds) []refundEntry {
	switch len(gathered) {
	case 0:
		return nil
	case 1:
		return gathered[0].entries
	}
	var out []refundEntry
	index := make(map[refundBucket]int)
	for _, r := range gathered {
		for _, e := range r.entries {
			if i, ok := index[e.refundBucket]; ok {
				out[i].amount += e.amount
				continue
			}
			index[e.refundBucket] = len(out)
			out = append(out, e)
		}
	}
	return out
}

// apply lays out one apply script call in slot group g: refunds, then reservations,
// and the reservations' sum by bucket (batch.go).
func (s *Store) apply(g int, refund []refundEntry, reserves []*budget.Reservation) ([]string, []any, *batchSum) {
	buckets := len(refund)
	for _, r := range reserves {
		buckets += len(r.Requests) + len(r.Tokens)
	}
	l := getLayout(buckets, buckets-len(refund))
	p := &l.spec
	for _, e := range refund {
		p.add(s, e.key, e.capacity, e.rate, e.amount)
	}
	// The reservations' buckets after the refunds': room for all of them at once.
	p.buf = slices.Grow(p.buf, (buckets-len(refund))*decideSpecSize)
	ends := make([]int, 1, 1+len(reserves))
	ends[0] = len(p.buf)
	args := make([]any, 3, 3+2*len(reserves))
	args[1] = ""
	sum := &l.sum
	for _, r := range reserves {
		if args[1] == "" && fenceable(r) {
			args[1] = s.want()
		}
		sum.startReservation()
		for i := range r.Requests {
			p.addDecide(s, &r.Requests[i], 1, sum)
		}
		for i := range r.Tokens {
			p.addDecide(s, &r.Tokens[i], r.Tokens[i].Amount, sum)
		}
		ends = append(ends, len(p.buf))
		args = append(args, len(r.Requests), nil)
	}
	// The spec buffer grew while it was filled: slice it once it is complete. The
	// slices live in one array and go to go-redis by pointer, so that none is boxed.
	segs := make([]specArg, 1+len(reserves))
	segs[0] = p.buf[:ends[0]]
	args[0] = &segs[0]
	l.sumBuf = sum.spec(l.sumBuf[:0])
	l.sumArg = l.sumBuf
	args[2] = &l.sumArg
	if len(l.sumBuf) > 0 {
		// The reservations in the sum's terms, in one argument.
		l.termsBuf = sum.terms(l.termsBuf[:0], reserves)
		l.termsArg = l.termsBuf
		args = append(args[:3], &l.termsArg)
	} else {
		for i := 1; i < len(ends); i++ {
			segs[i] = p.buf[ends[i-1]:ends[i]]
			args[2*i+2] = &segs[i]
		}
	}
	if args[1] != "" {
		// The epoch key goes last, after every bucket's: the spec never indexes it.
		return append(p.keys, s.groups[g].key), args, sum
	}
	return p.keys, args, sum
}

// specArg is one spec argument of a script call. go-redis writes it as the bytes it
// holds; a pointer to one in an array is an argument that costs no allocation.
type specArg []byte

// MarshalBinary implements encoding.BinaryMarshaler for go-redis.
func (a *specArg) MarshalBinary() ([]byte, error) { return *a, nil }

// spec lays out one script call's buckets: the keys, one per dimension and id in the
// order first seen, and the binary bucket spec (see scripts.go).
type spec struct {
	ids  []budget.Key
	keys []string
	// byID indexes ids once there are many (a call for many requests).
	byID map[budget.Key]int
	buf  []byte
}

func newSpec(buckets int) *spec {
	return &spec{
		ids:  make([]budget.Key, 0, min(buckets, int(budget.NumDimensions))),
		keys: make([]string, 0, min(buckets, int(budget.NumDimensions))),
		buf:  make([]byte, 0, buckets*specSize),
	}
}

// add appends one bucket with the script's three numbers for it.
func (p *spec) add(s *Store, k budget.Key, x, y, z float64) {
	p.buf = binary.LittleEndian.AppendUint16(p.buf, uint16(p.index(s, k)))
	p.buf = append(p.buf, slot(k))
	p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(x))
	p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(y))
	p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(z))
}

// Flags of a bucket in a reservation's spec.
const (
	flagWarn     = 1
	flagCalendar = 2
	// flagDurable marks a durable bucket that may refuse: its decision is checked
	// against the trust fence.
	flagDurable = 4
)

// addDecide appends one bucket of a reservation: its flags, shared capacity and rate,
// the wait of a zero allowance (or a calendar window's end, in Unix milliseconds),
// and what it takes; and adds it to the batch's sum.
func (p *spec) addDecide(s *Store, ch *budget.Charge, amount float64, sum *batchSum) {
	k, sl := uint16(p.index(s, ch.Key)), slot(ch.Key)
	p.buf = binary.LittleEndian.AppendUint16(p.buf, k)
	p.buf = append(p.buf, sl)
	var flags byte
	wait := float64(ch.WaitPeriod().Milliseconds())
	if ch.Warn {
		flags |= flagWarn
	}
	if ch.Key.Kind == budget.Calendar {
		flags |= flagCalendar
		wait = float64(ch.EndMillis)
	}
	if ch.Durable && !ch.Warn {
		flags |= flagDurable
	}
	p.buf = append(p.buf, flags)
	for _, v := range [4]float64{ch.SharedCapacity, ch.SharedRate, wait, amount} {
		p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(v))
	}
	sum.add(k, sl, flags, ch.SharedCapacity, ch.SharedRate, wait, amount)
}

// slot is the bucket's slot in its key: limits keep an id's request, minute and day
// buckets in one key; a rule's counter has a key of its own.
func slot(k budget.Key) byte {
	if k.Kind < budget.Rolling {
		return byte(k.Kind)
	}
	return 0
}

// index is the 1-based index in keys of the key holding k.
func (p *spec) index(s *Store, k budget.Key) int {
	if k.Kind < budget.Rolling {
		k.Kind = 0 // one key holds the id's three buckets of limits
	}
	if p.byID != nil {
		if i, ok := p.byID[k]; ok {
			return i
		}
	} else {
		for i, id := range p.ids {
			if id == k {
				return i + 1
			}
		}
	}
	p.ids = append(p.ids, k)
	p.keys = append(p.keys, s.Key(k))
	if p.byID == nil && len(p.ids) > 8 {
		p.byID = make(map[budget.Key]int, 2*len(p.ids))
		for i, id := range p.ids {
			p.byID[id] = i + 1
		}
	} else if p.byID != nil {
		p.byID[k] = len(p.ids)
	}
	return len(p.ids)
}
