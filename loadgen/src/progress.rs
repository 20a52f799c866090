//! The progress bar (and setup/drain spinners) on stderr, drawn only on a
//! terminal and never with `--no-progress`, so scripted runs print nothing
//! but their result.

use crate::budget::Budget;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A progress bar on stderr, or nothing when disabled.
pub struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// A bar following `budget`: ops done out of `--total`, or time elapsed
    /// out of `--duration`.
    pub fn for_budget(enabled: bool, name: &str, budget: Arc<Budget>) -> Progress {
        if !enabled {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        let by_count = budget.total().is_some()
            && budget
                .duration()
                .is_none_or(|d| d > Duration::from_secs(3600));
        let (len, template) = if by_count {
            (
                budget.total().unwrap_or(0),
                "{prefix:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} ops ({per_sec}, eta {eta})",
            )
        } else {
            (
                budget.duration().unwrap_or_default().as_millis() as u64,
                "{prefix:>12} [{elapsed_precise}] {wide_bar} {msg}",
            )
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
        bar.set_prefix(name.to_string());
        let b = bar.clone();
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let done = budget.done.load(Ordering::Relaxed);
                if by_count {
                    b.set_position(done);
                } else {
                    b.set_position(budget.start().elapsed().as_millis() as u64);
                    let rate = done as f64 / budget.start().elapsed().as_secs_f64().max(1e-3);
                    b.set_message(format!("{done} ops ({rate:.0}/s)"));
                }
            }
        });
        Progress {
            bar: Some(bar),
            ticker: Some(ticker),
        }
    }

    /// A spinner with a message, for setup and drain phases.
    pub fn spinner(enabled: bool, msg: &str) -> Progress {
        if !enabled {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_message(msg.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress {
            bar: Some(bar),
            ticker: None,
        }
    }

    /// Removes the bar.
    pub fn finish(self) {
        if let Some(t) = self.ticker {
            t.abort();
        }
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
