// Package demo is the main job of the clusterip command: it walks one cluster through the
// upgrade of its Service IP allocators, Legacy, then DualWrite beside Legacy, then IPAddressOnly,
// on real components it starts itself, and checks what it shows.
package demo
