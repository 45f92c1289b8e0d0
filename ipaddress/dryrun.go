package ipaddress

import (
	"context"
	"fmt"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
)

// dryRun answers as its Allocator would and changes nothing.
type dryRun struct {
	allocbase.DryRunView
	a *Allocator
}

func (d dryRun) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	a := d.a
	if _, err := a.offsetOf(ip); err != nil {
		return err
	}
	if err := allocator.CheckOwner(owner); err != nil {
		return err
	}
	if err := a.readyErr(); err != nil {
		return err
	}
	if a.Has(ip) {
		return fmt.Errorf("ipaddress: %s: %w", ip, allocator.ErrAllocated)
	}
	if !a.serverDryRun {
		return nil
	}
	_, err := a.client.Create(ctx, ObjectFor(ip, owner, a.managedBy), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return nil
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("ipaddress: %s: %w (%w)", ip, allocator.ErrAllocated, err)
	}
	return fmt.Errorf("ipaddress: dry-run create IPAddress %s: %w", ip, err)
}

func (d dryRun) AllocateNext(_ context.Context, owner allocator.Owner) (netip.Addr, error) {
	if err := allocator.CheckOwner(owner); err != nil {
		return netip.Addr{}, err
	}
	a := d.a
	if err := a.readyErr(); err != nil {
		return netip.Addr{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	off, ok := a.pickLocked()
	if !ok {
		return netip.Addr{}, allocator.ErrFull
	}
	return a.addrAt(off), nil
}

func (d dryRun) DryRun() allocator.Interface { return d }
