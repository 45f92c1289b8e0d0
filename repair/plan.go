package repair

import "github.com/kube-ipam/clusterip/featuregate"

// Plan returns, as one phrase for a person, what a Controller in mode does about a finding of
// class c: the repair plan a command shows before it repairs. Leaks wait for the hold-off of
// Options.LeakGrace; the classes that only get an Event say which. An unknown class or mode
// gives "nothing".
//
// In Legacy and DualWrite mode every IP a Service holds also gets its bit set if it is clear,
// whatever its class, except an invalid or out-of-range one.
func (c Class) Plan(mode featuregate.Mode) string {
	switch mode {
	case featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly:
	default:
		return "nothing"
	}
	bits := mode != featuregate.IPAddressOnly
	switch c {
	case Invalid:
		return "nothing: an Event (ClusterIPNotValid) asks to recreate the Service"
	case OutOfRange:
		return "nothing: an Event (ClusterIPOutOfRange) asks to recreate the Service"
	case DuplicateOwner:
		if bits {
			return "set the bit if clear; an Event (ClusterIPAlreadyAllocated) asks to recreate all but one of the Services"
		}
		return "nothing: an Event (ClusterIPAlreadyAllocated) asks to recreate all but one of the Services"
	case WrongParent:
		if bits {
			return "recreate the IPAddress with the Service as its parent; set the bit if clear"
		}
		return "recreate the IPAddress with the Service as its parent"
	case Missing:
		switch mode {
		case featuregate.Legacy:
			return "set the bit"
		case featuregate.DualWrite:
			return "create the IPAddress; set the bit if clear"
		}
		return "create the IPAddress"
	case Leaked:
		switch mode {
		case featuregate.Legacy:
			return "clear the bit once seen leaked on 3 passes and for the hold-off"
		case featuregate.DualWrite:
			return "delete the IPAddress, and clear its bit if set, once it is older than the hold-off"
		}
		return "delete the IPAddress once it is older than the hold-off"
	case BitmapOnly:
		if mode == featuregate.DualWrite {
			return "clear the bit once seen stale for the hold-off, unless an IPAddress appears"
		}
	case IPAddressOnly:
		if mode == featuregate.DualWrite {
			return "set the bit"
		}
	}
	return "nothing"
}
