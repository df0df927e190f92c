package demo

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The ledger is the demo server's side effect: stock, reservations and
// charges, as in the seed's tests, kept in a bbolt file of its own so that
// it survives a SIGKILL of the server and can be counted at the end. It is
// deliberately separate from the idempotency store: the point of the demo is
// that the middleware, not the ledger, keeps charges single.
//
// Buckets:
//
//	meta          "stock", "initial", "epoch" (uint64 big-endian)
//	charges       seq -> chargeRow   one row per charge made, never updated
//	runs          seq -> runRow      one row per handler run that reached the ledger
//	reservations  key -> qty          units reserved by the key's charges
//	byKey         key -> seq          the key's first charge (the fence)
var (
	bucketMeta         = []byte("meta")
	bucketCharges      = []byte("charges")
	bucketRuns         = []byte("runs")
	bucketReservations = []byte("reservations")
	bucketByKey        = []byte("byKey")
)

type chargeRow struct {
	Seq      uint64 `json:"seq"`
	Key      string `json:"key"`
	SKU      string `json:"sku"`
	Qty      int    `json:"qty"`
	Cents    int    `json:"cents"`
	ChargeID string `json:"charge_id"`
	Token    uint64 `json:"token"`
	Epoch    uint64 `json:"epoch"`
}

type runRow struct {
	Key     string `json:"key"`
	Token   uint64 `json:"token"`
	Epoch   uint64 `json:"epoch"`
	Charged bool   `json:"charged"`
}

type ledger struct {
	db    *bolt.DB
	epoch uint64
}

// openLedger opens (or creates with initialStock) the ledger file and starts
// a new server epoch in it.
func openLedger(path string, initialStock int) (*ledger, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	l := &ledger{db: db}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketCharges, bucketRuns, bucketReservations, bucketByKey} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if meta.Get([]byte("initial")) == nil {
			if err := meta.Put([]byte("initial"), u64(uint64(initialStock))); err != nil {
				return err
			}
			if err := meta.Put([]byte("stock"), u64(uint64(initialStock))); err != nil {
				return err
			}
		}
		l.epoch = getU64(meta.Get([]byte("epoch"))) + 1
		return meta.Put([]byte("epoch"), u64(l.epoch))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return l, nil
}

func (l *ledger) Close() error { return l.db.Close() }

var errOutOfStock = errors.New("out of stock")

// charge takes qty units and cents for key, in one fsynced transaction, and
// records the run. When fenced is true (the handler runs under a Guard and
// has a fencing token), a key that was charged already is not charged again:
// this is the downstream half of the guarantee the package documents for a
// holder that crashed after its side effect and before its result was
// stored. The earlier charge is returned, so the answer is the same bytes.
// Unfenced (the broken server variant), every call charges.
func (l *ledger) charge(key, sku string, qty, cents int, token uint64, fenced bool) (chargeRow, bool, error) {
	var row chargeRow
	charged := false
	err := l.db.Update(func(tx *bolt.Tx) error {
		charged = false
		byKey := tx.Bucket(bucketByKey)
		if fenced {
			if seq := byKey.Get([]byte(key)); seq != nil {
				raw := tx.Bucket(bucketCharges).Get(seq)
				if err := json.Unmarshal(raw, &row); err != nil {
					return err
				}
				return l.addRun(tx, runRow{Key: key, Token: token, Epoch: l.epoch})
			}
		}
		meta := tx.Bucket(bucketMeta)
		stock := getU64(meta.Get([]byte("stock")))
		if stock < uint64(qty) {
			return errOutOfStock
		}
		if err := meta.Put([]byte("stock"), u64(stock-uint64(qty))); err != nil {
			return err
		}
		charges := tx.Bucket(bucketCharges)
		seq, err := charges.NextSequence()
		if err != nil {
			return err
		}
		row = chargeRow{Seq: seq, Key: key, SKU: sku, Qty: qty, Cents: cents,
			ChargeID: fmt.Sprintf("ch_%d", seq), Token: token, Epoch: l.epoch}
		raw, err := json.Marshal(row)
		if err != nil {
			return err
		}
		if err := charges.Put(u64(seq), raw); err != nil {
			return err
		}
		res := tx.Bucket(bucketReservations)
		if err := res.Put([]byte(key), u64(getU64(res.Get([]byte(key)))+uint64(qty))); err != nil {
			return err
		}
		if byKey.Get([]byte(key)) == nil {
			if err := byKey.Put([]byte(key), u64(seq)); err != nil {
				return err
			}
		}
		charged = true
		return l.addRun(tx, runRow{Key: key, Token: token, Epoch: l.epoch, Charged: true})
	})
	return row, charged, err
}

func (l *ledger) addRun(tx *bolt.Tx, r runRow) error {
	runs := tx.Bucket(bucketRuns)
	seq, err := runs.NextSequence()
	if err != nil {
		return err
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return runs.Put(u64(seq), raw)
}

// ledgerState is everything the campaign counts at the end.
type ledgerState struct {
	Initial, Stock uint64
	Epochs         uint64
	Charges        []chargeRow
	Runs           []runRow
	Reservations   map[string]uint64
}

// readLedger reads the whole ledger file. The server must have closed it.
func readLedger(path string) (*ledgerState, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	defer db.Close()
	st := &ledgerState{Reservations: map[string]uint64{}}
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return errors.New("ledger: no meta bucket (the server never opened it)")
		}
		st.Initial = getU64(meta.Get([]byte("initial")))
		st.Stock = getU64(meta.Get([]byte("stock")))
		st.Epochs = getU64(meta.Get([]byte("epoch")))
		if err := tx.Bucket(bucketCharges).ForEach(func(_, v []byte) error {
			var r chargeRow
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			st.Charges = append(st.Charges, r)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketRuns).ForEach(func(_, v []byte) error {
			var r runRow
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			st.Runs = append(st.Runs, r)
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketReservations).ForEach(func(k, v []byte) error {
			st.Reservations[string(k)] = getU64(v)
			return nil
		})
	})
	return st, err
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
