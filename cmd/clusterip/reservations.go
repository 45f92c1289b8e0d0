package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/reservation"
)

const reservationsLong = `Reserve Service ClusterIPs: keep addresses out of dynamic allocation, for a future Service
(namespace/name) or anonymously under a name, optionally until a time. A reservation is an
IPAddress object managed by ` + reservation.ManagedBy + `, which stock kube-apiserver
(IPAddressOnly mode) skips when it picks an address, refuses to a Service that asks for it (422
"provided IP is already allocated") and leaves out of its repair.

  list     every reservation (-o table, wide, name, json or yaml: an IPAddressList)
  create   reserve an address; refused, with nothing written, for an address outside every
           ServiceCIDR, a network or broadcast address, or an address something holds
  delete   release a reservation; an address a Service holds is never released
  webhook  serve the webhook and run the controller that claim and retain reservations beside
           a stock kube-apiserver (see its --help)

Permissions: the ClusterRole clusterip-reservations in deploy/rbac of the clusterip repository
grants exactly what list, create and delete call; webhook's are in deploy/webhook/webhook.yaml.

Exit codes: 0 done; 2 could not run (bad flags or arguments, no kubeconfig, an address refused,
the API server unreachable).`

const reservationsExample = `  # Keep 10.96.0.20 for the Service default/web, which gets it when it is created
  clusterip reservations create 10.96.0.20 --for default/web --reason "clients pin it"

  # Hold 10.96.0.21 for ten minutes (a cooldown), anonymously
  clusterip reservations create 10.96.0.21 --name cooldown-a --for-duration 10m

  clusterip reservations list -o yaml
  clusterip reservations delete 10.96.0.21`

// reservationsOptions are the flags of the reservations verbs; the connection ones (kube.kube)
// are check's.
type reservationsOptions struct {
	kube        checkOptions
	output      string
	forService  string
	name        string
	reason      string
	forDuration time.Duration
	expires     string
}

func newReservationsCommand() *cobra.Command {
	o := &reservationsOptions{kube: checkOptions{kube: newKubeFlags()}, output: "table"}
	cmd := &cobra.Command{
		Use:     "reservations",
		Aliases: []string{"reservation"},
		Short:   "List, create and delete reserved Service ClusterIPs",
		Long:    reservationsLong,
		Example: reservationsExample,
		Args:    unknownCommand,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("no reservations verb given: list, create or delete (see --help)")
		},
	}
	addKubeFlags(cmd, cmd.PersistentFlags(), o.kube.kube)

	list := &cobra.Command{
		Use:   "list",
		Short: "List every reservation",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			printList, err := reservationsPrinter(o.output, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			client, _, err := o.kube.kubeClient()
			if err != nil {
				return err
			}
			l, err := listReservations(cmd.Context(), client)
			if err != nil {
				return withRoleHint(err)
			}
			return printList(cmd.OutOrStdout(), l, time.Now())
		},
	}
	list.Flags().StringVarP(&o.output, "output", "o", o.output, "output format: table, wide, name, json or yaml (an IPAddressList, as kubectl get prints it)")
	completeOutputs(list, reservationsOutputs)

	create := &cobra.Command{
		Use:   "create ADDRESS (--for NAMESPACE/NAME | --name NAME)",
		Short: "Reserve an address",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := o.reservation(args[0], time.Now())
			if err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			if err := c.Reserve(cmd.Context(), r); err != nil {
				return withRoleHint(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reserved %s\n", r.Addr)
			return nil
		},
	}
	cf := create.Flags()
	cf.StringVar(&o.forService, "for", "", "the Service the address is kept for, as NAMESPACE/NAME")
	cf.StringVar(&o.name, "name", "", "the name of an anonymous reservation, a DNS label")
	cf.StringVar(&o.reason, "reason", "", "why the address is reserved, for people")
	cf.DurationVar(&o.forDuration, "for-duration", 0, "end the reservation this long from now (a cooldown)")
	cf.StringVar(&o.expires, "expires", "", "end the reservation at this time, RFC 3339")

	del := &cobra.Command{
		Use:   "delete ADDRESS",
		Short: "Release a reservation",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return fmt.Errorf("address %q: %w", args[0], err)
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			if err := c.Release(cmd.Context(), addr); err != nil {
				return withRoleHint(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "released %s\n", addr)
			return nil
		},
	}
	cmd.AddCommand(list, create, del, newReservationsWebhookCommand(&o.kube))
	return cmd
}

// withRoleHint names the ClusterRole that grants what the reservations verbs need when the API
// server refused err for want of a permission, and returns any other err as it is.
func withRoleHint(err error) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	return fmt.Errorf("%w; bind the ClusterRole clusterip-reservations (deploy/rbac in the clusterip repository)", err)
}

// client returns a reservation.Client of the kubeconfig's cluster.
func (o *reservationsOptions) client() (*reservation.Client, error) {
	client, _, err := o.kube.kubeClient()
	if err != nil {
		return nil, err
	}
	return reservation.New(client)
}

// reservation returns the Reservation the create flags and addr describe, validated.
func (o *reservationsOptions) reservation(addr string, now time.Time) (reservation.Reservation, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return reservation.Reservation{}, fmt.Errorf("address %q: %w", addr, err)
	}
	r := reservation.Reservation{Addr: a, Name: o.name, Reason: o.reason}
	if o.forService != "" {
		ns, name, ok := strings.Cut(o.forService, "/")
		if !ok {
			return reservation.Reservation{}, fmt.Errorf("--for %q: want NAMESPACE/NAME", o.forService)
		}
		r.For = types.NamespacedName{Namespace: ns, Name: name}
	}
	switch {
	case o.forDuration != 0 && o.expires != "":
		return reservation.Reservation{}, errors.New("--for-duration and --expires: give one")
	case o.forDuration < 0:
		return reservation.Reservation{}, fmt.Errorf("--for-duration %v: want more than 0", o.forDuration)
	case o.forDuration > 0:
		r.Expires = now.Add(o.forDuration).UTC()
	case o.expires != "":
		t, err := time.Parse(time.RFC3339Nano, o.expires)
		if err != nil {
			return reservation.Reservation{}, fmt.Errorf("--expires %q: %w", o.expires, err)
		}
		r.Expires = t.UTC()
	}
	if err := reservation.Validate(r); err != nil {
		return reservation.Reservation{}, err
	}
	return r, nil
}
