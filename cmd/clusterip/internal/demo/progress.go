package demo

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// progress shows how far a phase is. start shows a phase of duration d whose counts status
// gives, and returns the function that ends it.
type progress interface {
	start(name string, d time.Duration, status func() string) (done func())
}

// newProgress returns bars on opts.Progress if it is set (a terminal), else plain lines on
// opts.Out every few seconds.
func newProgress(opts *Options) progress {
	if opts.Progress != nil {
		return bars{w: opts.Progress}
	}
	return lines{w: opts.Out, every: 5 * time.Second}
}

// bars draws a live progress bar of the time elapsed in a phase, with its counts.
type bars struct{ w io.Writer }

func (b bars) start(name string, d time.Duration, status func() string) func() {
	p := mpb.New(mpb.WithOutput(b.w), mpb.WithWidth(40), mpb.WithRefreshRate(150*time.Millisecond))
	total := d.Milliseconds()
	bar := p.AddBar(total,
		mpb.PrependDecorators(decor.Name(name, decor.WC{C: decor.DindentRight | decor.DextraSpace})),
		mpb.AppendDecorators(decor.Any(func(st decor.Statistics) string {
			return fmt.Sprintf("%v/%v  %s", time.Duration(st.Current)*time.Millisecond/time.Second*time.Second, d, status())
		})),
	)
	began := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				bar.SetCurrent(min(time.Since(began).Milliseconds(), total-1))
			}
		}
	}()
	return func() {
		close(stop)
		wg.Wait()
		bar.SetCurrent(total)
		p.Wait()
	}
}

// lines prints a line of a phase's counts every so often and when it ends, where no terminal
// shows bars.
type lines struct {
	w     io.Writer
	every time.Duration
}

func (l lines) start(name string, d time.Duration, status func() string) func() {
	began := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(l.every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Fprintf(l.w, "%s: %v of %v, %s\n", name, time.Since(began).Round(time.Second), d, status())
			}
		}
	}()
	return func() {
		close(stop)
		wg.Wait()
		fmt.Fprintf(l.w, "%s: done in %v, %s\n", name, time.Since(began).Round(100*time.Millisecond), status())
	}
}
