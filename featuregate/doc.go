// Package featuregate declares kube-apiserver's two Service IP allocator feature gates,
// MultiCIDRServiceAllocator and DisableAllocatorDualWrite, with the versioned defaults
// kube-apiserver gives them, and maps their values to the allocator Mode a registry runs in.
//
// The gates are registered into a caller's k8s.io/component-base feature gate, so that the usual
// --feature-gates flag and emulation version (--emulated-version) decide them exactly as they do
// in kube-apiserver:
//
//	| MultiCIDRServiceAllocator | DisableAllocatorDualWrite | Mode          |
//	|---------------------------|---------------------------|---------------|
//	| off                       | off                       | Legacy        |
//	| off                       | on                        | Legacy        |
//	| on                        | off                       | DualWrite     |
//	| on                        | on                        | IPAddressOnly |
//
// DisableAllocatorDualWrite only means something with MultiCIDRServiceAllocator on: kube-apiserver
// 1.31 to 1.34 declare no dependency between the two and check the second only where the first is
// on, so with the first off they run the bitmaps alone whatever the second says (upstream's own
// integration tests start servers that way). By default that is Legacy for kube-apiserver 1.31
// and 1.32, DualWrite for 1.33 and IPAddressOnly for 1.34 and later.
//
// kube-apiserver 1.38 removed both gates with the bitmaps and dual write: it runs IPAddressOnly
// only, at every version it emulates (1.35 to 1.38), and refuses either name in --feature-gates
// as an unrecognized gate. NewGate, GatesAt and ModeAt follow the binary version; Add, ModeOf and
// ModeFor speak of the gates as releases up to 1.37 declare them.
package featuregate
