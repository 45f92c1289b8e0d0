package linearizability

import (
	"fmt"
	"strings"
)

// Origin says whose code a process of a history ran: a stock kube-apiserver, or clusterip's (its
// library in one of its modes, or a kube-apiserver fork built on it).
type Origin struct {
	// Process is the name the history records (Op.Process), such as "legacy-0#1".
	Process string
	// Stock is true for a stock kube-apiserver, whose defects do not count against clusterip;
	// false for clusterip's processes and for any process [OriginOf] does not know.
	Stock bool
	// Software names the code, such as "stock kube-apiserver v1.33.13" or "clusterip library,
	// Legacy mode".
	Software string
}

func (o Origin) String() string { return o.Process + " (" + o.Software + ")" }

// The names the harness records in Op.Process for the stock kube-apiserver: the Service workers'
// creates and deletes through it, and the Services it held before the history began.
const (
	stockProcess  = "kube-apiserver"
	beforeProcess = "before"
)

// forkPrefix starts the Op.Process of a kube-apiserver fork built on clusterip (forks/), as
// "fork-v1.33.13".
const forkPrefix = "fork-"

// clusteripModes are the Op.Process prefixes of the allocator processes of the harness
// (process_test.go), "MODE-SLOT#INCARNATION", and the modes they name.
var clusteripModes = map[string]string{"legacy": "Legacy", "dualwrite": "DualWrite", "ipaddressonly": "IPAddressOnly"}

// OriginOf returns the origin of process, a name a history records in Op.Process, in a history
// recorded beside stockRelease, the release of the stock kube-apiserver (such as "v1.33.13"):
//
//   - "kube-apiserver" (a Service create or delete through it) and "before" (a Service it held
//     before the history began): the stock kube-apiserver of stockRelease;
//   - "legacy-N#I", "dualwrite-N#I", "ipaddressonly-N#I": incarnation I of the clusterip
//     allocator process N, in that mode;
//   - "fork-RELEASE...": a kube-apiserver fork built on clusterip;
//   - any other name: unknown, which is not stock, so that what it does counts against clusterip.
func OriginOf(process, stockRelease string) Origin {
	o := Origin{Process: process}
	switch {
	case process == stockProcess || process == beforeProcess:
		o.Stock, o.Software = true, "stock kube-apiserver "+stockRelease
	case strings.HasPrefix(process, forkPrefix):
		release, _, _ := strings.Cut(strings.TrimPrefix(process, forkPrefix), "#")
		o.Software = "clusterip fork of kube-apiserver " + release
	default:
		mode, rest, ok := strings.Cut(process, "-")
		slot, inc, hasInc := strings.Cut(rest, "#")
		if m, known := clusteripModes[mode]; ok && known && hasInc && slot != "" && inc != "" {
			o.Software = fmt.Sprintf("clusterip library, %s mode", m)
		} else {
			o.Software = "unknown, counted as clusterip's"
		}
	}
	return o
}
