package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// boundedKV bounds every call of an etcd KV by d (0: no bound), so that an etcd that accepts the connection and
// then stops answering fails the call (and check exits 2) instead of blocking check forever: the
// audit's reads, repair's compare-and-swaps and every read between them go through it. A call
// that runs out of time returns an error saying so, wrapping ctx's.
type boundedKV struct {
	clientv3.KV
	d time.Duration
}

// bound returns ctx bounded by k.d, and how to finish with it: finish(err) releases it and says,
// if err came from running out of time, which bound it was.
func (k boundedKV) bound(ctx context.Context) (context.Context, func(error) error) {
	if k.d == 0 { // --request-timeout 0: no bound
		return ctx, func(err error) error { return err }
	}
	tctx, cancel := context.WithTimeout(ctx, k.d)
	return tctx, func(err error) error {
		defer cancel()
		if err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("etcd did not answer within %v (--request-timeout): %w", k.d, err)
		}
		return err
	}
}

func (k boundedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, finish := k.bound(ctx)
	resp, err := k.KV.Get(ctx, key, opts...)
	return resp, finish(err)
}

func (k boundedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	ctx, finish := k.bound(ctx)
	resp, err := k.KV.Put(ctx, key, val, opts...)
	return resp, finish(err)
}

func (k boundedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	ctx, finish := k.bound(ctx)
	resp, err := k.KV.Delete(ctx, key, opts...)
	return resp, finish(err)
}

func (k boundedKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	ctx, finish := k.bound(ctx)
	resp, err := k.KV.Compact(ctx, rev, opts...)
	return resp, finish(err)
}

func (k boundedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	ctx, finish := k.bound(ctx)
	resp, err := k.KV.Do(ctx, op)
	return resp, finish(err)
}

// Txn returns a transaction whose Commit is bounded by k.d from the call of Txn.
func (k boundedKV) Txn(ctx context.Context) clientv3.Txn {
	ctx, finish := k.bound(ctx)
	return &boundedTxn{Txn: k.KV.Txn(ctx), finish: finish}
}

// boundedTxn is a clientv3.Txn of a boundedKV: its Commit releases the bound.
type boundedTxn struct {
	clientv3.Txn
	finish func(error) error
}

func (t *boundedTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *boundedTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *boundedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *boundedTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	return resp, t.finish(err)
}

var _ clientv3.KV = boundedKV{}
