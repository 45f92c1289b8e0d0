package main

import (
	"context"
	"fmt"
	"io"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/reservation"
)

// reservationsOutputs are the values of "reservations list -o", kubectl get's for a list of
// objects: a table (the default; wide adds columns), the objects' names, or the objects
// themselves as an IPAddressList in JSON or YAML.
var reservationsOutputs = []string{"table", "wide", "name", "json", "yaml"}

// ipAddressGVK is the kind of a reservation's object, and ipAddressListGVK of a list of them.
var (
	ipAddressGVK     = networkingv1.SchemeGroupVersion.WithKind("IPAddress")
	ipAddressListGVK = networkingv1.SchemeGroupVersion.WithKind("IPAddressList")
)

// reservationsPrinter returns how "reservations list -o format" prints a list, or kubectl's
// error for a format it does not know: the list is never read then.
func reservationsPrinter(format string, stderr io.Writer) (func(io.Writer, *networkingv1.IPAddressList, time.Time) error, error) {
	var p printers.ResourcePrinter
	switch format {
	case "json":
		p = &printers.OmitManagedFieldsPrinter{Delegate: &printers.JSONPrinter{}}
	case "yaml":
		p = &printers.OmitManagedFieldsPrinter{Delegate: &printers.YAMLPrinter{}}
	case "name":
		return func(w io.Writer, list *networkingv1.IPAddressList, _ time.Time) error {
			np := &printers.NamePrinter{}
			for i := range list.Items {
				if err := np.PrintObj(&list.Items[i], w); err != nil {
					return err
				}
			}
			return nil
		}, nil
	case "table", "wide":
		tp := printers.NewTablePrinter(printers.PrintOptions{Wide: format == "wide"})
		return func(w io.Writer, list *networkingv1.IPAddressList, now time.Time) error {
			if len(list.Items) == 0 {
				fmt.Fprintln(stderr, "No reservations found.") // as kubectl get, on stderr
				return nil
			}
			return tp.PrintObj(reservationsTable(list, now), w)
		}, nil
	default:
		return nil, outputError(format, reservationsOutputs)
	}
	return func(w io.Writer, list *networkingv1.IPAddressList, _ time.Time) error { return p.PrintObj(list, w) }, nil
}

// listReservations returns the reservations' IPAddress objects (reservation.Client.ListObjects)
// as an IPAddressList, sorted by address, with their kinds set as kubectl prints them: -o json
// and -o yaml print them whole.
func listReservations(ctx context.Context, client kubernetes.Interface) (*networkingv1.IPAddressList, error) {
	rc, err := reservation.New(client)
	if err != nil {
		return nil, err
	}
	objs, err := rc.ListObjects(ctx)
	if err != nil {
		return nil, err
	}
	list := &networkingv1.IPAddressList{Items: objs}
	list.SetGroupVersionKind(ipAddressListGVK)
	for i := range list.Items {
		list.Items[i].SetGroupVersionKind(ipAddressGVK)
	}
	return list, nil
}

// reservationsTable returns list as the table "reservations list" prints, saying which
// reservations have ended at now. The columns of priority 1 are shown by -o wide only.
func reservationsTable(list *networkingv1.IPAddressList, now time.Time) *metav1.Table {
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Address", Type: "string", Format: "name", Description: "the reserved address, the IPAddress object's name"},
		{Name: "For", Type: "string", Description: "the Service the address is kept for, as namespace/name"},
		{Name: "Name", Type: "string", Description: "the name of an anonymous reservation"},
		{Name: "Expires", Type: "string", Description: "when the reservation ends, RFC 3339, or never"},
		{Name: "Reason", Type: "string", Description: "why the address is reserved"},
		{Name: "Age", Type: "string", Description: "how long ago the reservation was made"},
		{Name: "Ends-In", Type: "string", Priority: 1, Description: "how long until the reservation ends"},
		{Name: "ParentRef", Type: "string", Priority: 1, Description: "the IPAddress object's parentRef, group/resource/namespace/name"},
	}}
	for i := range list.Items {
		obj := &list.Items[i]
		r, _ := reservation.FromObject(obj) // listReservations kept only those it takes
		expires, endsIn := "never", "-"
		if !r.Expires.IsZero() {
			expires = r.Expires.Format(time.RFC3339)
			endsIn = duration.HumanDuration(r.Expires.Sub(now))
			if r.Expired(now) {
				expires += " (ended)"
				endsIn = "ended"
			}
		}
		age := "<unknown>"
		if !obj.CreationTimestamp.IsZero() {
			age = duration.HumanDuration(now.Sub(obj.CreationTimestamp.Time))
		}
		forService := ""
		if r.For.Name != "" {
			forService = r.For.String()
		}
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells:  []any{r.Addr.String(), dash(forService), dash(r.Name), expires, dash(r.Reason), age, endsIn, parentRef(obj.Spec.ParentRef)},
			Object: runtime.RawExtension{Object: obj},
		})
	}
	return t
}

// parentRef writes p as resource[.group]/[namespace/]name, the form of kubectl get ipaddresses'
// PARENTREF column.
func parentRef(p *networkingv1.ParentReference) string {
	if p == nil {
		return "-"
	}
	s := p.Resource
	if p.Group != "" {
		s = p.Resource + "." + p.Group
	}
	if p.Namespace != "" {
		s += "/" + p.Namespace
	}
	return s + "/" + p.Name
}

// dash writes an empty cell as "-".
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
