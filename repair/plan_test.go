package repair

import (
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/featuregate"
)

func TestPlanSaysWhatTheControllerDoesPerClassAndMode(t *testing.T) {
	tests := []struct {
		class Class
		mode  featuregate.Mode
		want  string // a phrase the plan must contain
	}{
		{Invalid, featuregate.DualWrite, "Event (ClusterIPNotValid)"},
		{DuplicateOwner, featuregate.IPAddressOnly, "nothing: an Event (ClusterIPAlreadyAllocated)"},
		{DuplicateOwner, featuregate.Legacy, "set the bit if clear"},
		{OutOfRange, featuregate.Legacy, "nothing: an Event (ClusterIPOutOfRange)"},
		{WrongParent, featuregate.IPAddressOnly, "recreate the IPAddress"},
		{Missing, featuregate.Legacy, "set the bit"},
		{Missing, featuregate.DualWrite, "create the IPAddress; set the bit if clear"},
		{Missing, featuregate.IPAddressOnly, "create the IPAddress"},
		{Leaked, featuregate.Legacy, "on 3 passes and for the hold-off"},
		{Leaked, featuregate.DualWrite, "delete the IPAddress, and clear its bit if set"},
		{Leaked, featuregate.IPAddressOnly, "delete the IPAddress once it is older than the hold-off"},
		{BitmapOnly, featuregate.DualWrite, "clear the bit once seen stale for the hold-off"},
		{IPAddressOnly, featuregate.DualWrite, "set the bit"},
		{IPAddressOnly, featuregate.IPAddressOnly, "nothing"},
		{Class("unknown"), featuregate.DualWrite, "nothing"},
		{Leaked, featuregate.Mode(42), "nothing"},
	}
	for _, tt := range tests {
		if got := tt.class.Plan(tt.mode); !strings.Contains(got, tt.want) {
			t.Errorf("%s.Plan(%v) = %q, want it to say %q", tt.class, tt.mode, got, tt.want)
		}
	}
	for _, c := range Classes() {
		for _, m := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly} {
			if c.Plan(m) == "" {
				t.Errorf("%s.Plan(%v) is empty, want a phrase", c, m)
			}
		}
	}
}
