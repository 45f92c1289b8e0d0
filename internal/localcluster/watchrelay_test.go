package localcluster

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestRelayWatchQueuesEventsNobodyReadsAndKeepsTheirOrder: ten times the events a fake
// clientset's watcher holds are sent through an unbuffered source (each send waits until the relay
// took it) while nobody reads the relay; every send completes, and all arrive in order.
func TestRelayWatchQueuesEventsNobodyReadsAndKeepsTheirOrder(t *testing.T) {
	src := watch.NewFake()
	w := RelayWatch(src)
	defer w.Stop()
	n := 10 * int(watch.DefaultChanSize)
	for i := range n {
		src.Add(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(i)}})
	}
	for i := range n {
		select {
		case ev := <-w.ResultChan():
			if got := ev.Object.(*corev1.Service).Name; got != strconv.Itoa(i) {
				t.Fatalf("event %d is of Service %s, want %d", i, got, i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d of %d did not arrive", i, n)
		}
	}
}

// TestRelayWatchStopClosesTheResultAndStopsTheSource: after Stop, ResultChan is closed and the
// relayed watcher is stopped.
func TestRelayWatchStopClosesTheResultAndStopsTheSource(t *testing.T) {
	src := watch.NewRaceFreeFake()
	w := RelayWatch(src)
	w.Stop()
	w.Stop() // a second Stop is harmless
	select {
	case _, ok := <-w.ResultChan():
		if ok {
			t.Error("ResultChan gave an event after Stop, want it closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ResultChan not closed after Stop")
	}
	if !src.IsStopped() {
		t.Error("the relayed watcher is not stopped")
	}
}
