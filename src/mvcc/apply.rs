//! The one write path: every mutation (put, delete, txn, compaction, lease
//! grant, revoke and expiry) is an [`Entry`] given to [`Store::apply`].
//!
//! `apply` is a pure function of the store's prior state and the entry:
//! compares are evaluated inside it, revisions are assigned inside it in
//! call order, and it reads no clock and draws no random number (lease IDs,
//! expiry decisions and the initial revision come from the caller).
//!
//! The rule, for every arm below: nothing that one member holds alone may
//! change an outcome. Not its member ID, not its flags (the apply-affecting
//! ones are replicated as [`Entry::Limits`]), not its memory accounting or
//! budgets, not its clock. Checks that need such inputs run before an entry
//! is applied or proposed (the space quota: `quota.rs`); what they decide
//! reaches the log as an entry of its own (the NOSPACE alarm), so apply
//! refuses writes only from the replicated alarm table.
//! `tests/determinism.rs` replays one log into stores that differ in all of
//! those and requires identical answers and state. Its changes
//! reach readers and watchers only when the sequencer publishes its
//! revision, at its end. A replicated log will call it on every member in
//! log order.
//!
//! In a single process, gRPC handlers call it concurrently: writes to
//! different keys run in parallel under their key locks, and the result is
//! the same as applying the entries one by one in the order of the
//! revisions they got (a unit test replays concurrent runs serially and
//! compares).

use super::alarms;
use super::command::{AlarmChange, Command, Compaction};
use super::entry::{Applied, Entry};
use super::initial::COMPACT_REV_KEY;
use super::journal::{self, Change};
use super::quota::Space;
use super::store::Store;
use super::types::*;
use super::validate;
use crate::auth::AuthInfo;
use crate::error::{Error, Result};

impl Store {
    /// Applies one entry. Returns once its revision is visible to readers
    /// (and, with a journal, once its record is durable), waiting on the
    /// calling thread; async callers use [`Store::apply_async`].
    pub fn apply(&self, entry: Entry) -> Result<Applied> {
        let (applied, visible_at, durable_at) = self.apply_journaled(entry)?;
        self.sequencer().wait_visible(visible_at);
        if let (Some(journal), true) = (self.sequencer().journal(), durable_at > 0) {
            while journal.durable() < durable_at {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        Ok(applied)
    }

    /// [`Store::apply`] for async callers: while an earlier revision is
    /// still being applied by another thread, the task yields to the runtime
    /// instead of blocking its worker.
    pub async fn apply_async(&self, entry: Entry) -> Result<Applied> {
        let (applied, visible_at, durable_at) = self.apply_journaled(entry)?;
        self.sequencer().visible(visible_at).await;
        if let (Some(journal), true) = (self.sequencer().journal(), durable_at > 0) {
            let mut durable = journal.subscribe();
            while journal.durable() < durable_at {
                if durable.changed().await.is_err() {
                    break;
                }
            }
        }
        Ok(applied)
    }

    /// Applies an entry under the journal's cut (`journal.rs`): a keyed
    /// write shares it, any other entry holds it alone and, when it took
    /// no revision (whose record the sequencer hands over), has its record
    /// appended right after it applied. Returns the result, the revision
    /// that must be visible and the journal position that must be durable
    /// (0: none) before the result may be sent.
    fn apply_journaled(&self, entry: Entry) -> Result<(Applied, i64, u64)> {
        let Some(journal) = self.sequencer().journal() else {
            return self.apply_unpublished(entry).map(|(a, at)| (a, at, 0));
        };
        if journal::is_keyed_write(&entry) {
            let _cut = self.journal_cut().read();
            return self.apply_unpublished(entry).map(|(a, at)| (a, at, 0));
        }
        let _cut = self.journal_cut().write();
        let record = journal::changes_state(&entry).then(|| journal.encode(Change::Entry(&entry)));
        if matches!(entry, Entry::Initialize { .. }) {
            // It moves the revision: every earlier one is published first.
            self.sequencer().wait_visible(self.sequencer().allocated());
        }
        let before = self.sequencer().allocated();
        let (applied, visible_at) = self.apply_unpublished(entry)?;
        let durable_at = match record {
            Some(record) if self.sequencer().allocated() == before => journal.append(None, record),
            _ => 0,
        };
        Ok((applied, visible_at, durable_at))
    }

    /// Applies an entry; returns its result and the revision that must be
    /// visible before the result may be sent.
    pub(super) fn apply_unpublished(&self, entry: Entry) -> Result<(Applied, i64)> {
        match entry {
            Entry::Put(req) => {
                validate::check_put(&req)?;
                self.alarm_table().check_write(true)?;
                self.check_put_lease(&req)?;
                // Checked in full above: the write runs as a one-op txn
                // without the txn checks (etcd's unary put has none).
                let (resp, at) = self.write_txn(&one_op(RequestOp::Put(req)), None)?;
                match resp.responses.into_iter().next() {
                    Some(ResponseOp::Put(p)) => Ok((Applied::Put(p), at)),
                    _ => unreachable!("a put txn answers with a put response"),
                }
            }
            Entry::Delete(req) => {
                validate::check_key(&req.key)?;
                self.alarm_table().check_write(false)?;
                let (resp, at) = self.write_txn(&one_op(RequestOp::Delete(req)), None)?;
                match resp.responses.into_iter().next() {
                    Some(ResponseOp::Delete(d)) => Ok((Applied::Delete(d), at)),
                    _ => unreachable!("a delete txn answers with a delete response"),
                }
            }
            Entry::Txn(req) => {
                let (resp, at) = self.apply_txn(req)?;
                Ok((Applied::Txn(resp), at))
            }
            Entry::Compact { revision } => {
                self.alarm_table().check_write(false)?;
                let current = self.compact_history(revision)?;
                Ok((Applied::Compact { revision: current }, 0))
            }
            Entry::LeaseGrant { id, ttl } => {
                debug_assert!(id != 0, "the caller chooses lease IDs");
                // etcd checks the TTL before the request reaches its log.
                if ttl > crate::lease::MAX_LEASE_TTL {
                    return Err(Error::LeaseTtlTooLarge);
                }
                self.alarm_table().check_write(true)?;
                let _writers = self.range_writers().read();
                self.check_running()?;
                let ttl = self.lessor().grant(id, ttl)?;
                self.stats().applied();
                let revision = self.current_revision();
                Ok((Applied::LeaseGrant { id, ttl, revision }, 0))
            }
            Entry::LeaseRevoke { id } => {
                self.alarm_table().check_write(false)?;
                let revision = self.revoke_lease(id)?;
                Ok((Applied::LeaseRevoke { revision }, revision))
            }
            Entry::LeaseCheckpoint { checkpoints } => {
                for (id, remaining_ms) in checkpoints {
                    self.lessor().checkpoint(id, remaining_ms);
                }
                let revision = self.current_revision();
                Ok((Applied::LeaseCheckpoint { revision }, 0))
            }
            Entry::Initialize { revision } => {
                // Initialized already (a second leader proposed too): no
                // second jump, which would drop the history in between.
                let key = bytes::Bytes::from_static(COMPACT_REV_KEY.as_bytes());
                let present = self.range(&RangeRequest {
                    key: key.clone(),
                    count_only: true,
                    ..Default::default()
                })?;
                if present.count > 0 {
                    let revision = self.current_revision();
                    return Ok((Applied::Initialize { revision }, 0));
                }
                self.bump_to(revision)?;
                let put = PutRequest {
                    key,
                    value: bytes::Bytes::from(revision.to_string()),
                    ..Default::default()
                };
                let recorded_as = Entry::Initialize { revision };
                let (resp, at) =
                    self.write_txn(&one_op(RequestOp::Put(put)), Some(&recorded_as))?;
                let revision = resp.revision;
                Ok((Applied::Initialize { revision }, at))
            }
            Entry::Limits(limits) => {
                self.set_limits(limits);
                let revision = self.current_revision();
                Ok((Applied::Limits { revision }, 0))
            }
            Entry::Alarm {
                action,
                member_id,
                alarm,
            } => {
                let alarms = self.alarm_table().apply(action, member_id, alarm);
                if action != AlarmAction::Get {
                    self.stats().applied();
                    if !alarms.is_empty() {
                        tracing::warn!(?action, member_id, alarm, "alarm changed");
                    }
                }
                Ok((Applied::Alarm { alarms }, 0))
            }
            Entry::Auth(op) => {
                self.authorize_plain_auth(&op)?;
                self.apply_auth(&op)?;
                Ok((self.auth_applied(), 0))
            }
            Entry::Authorized { by, entry } => {
                self.authorize(&by, &entry)?;
                match *entry {
                    // Checked as `by`'s just now, not as a plain one.
                    Entry::Auth(op) => {
                        self.apply_auth(&op)?;
                        Ok((self.auth_applied(), 0))
                    }
                    other => self.apply_unpublished(other),
                }
            }
        }
    }

    /// A unary Put's lease check before its txn: as etcd's unary put does,
    /// before the ignore flags, that its lease exists unless unknown leases
    /// are adopted.
    fn check_put_lease(&self, req: &PutRequest) -> Result<()> {
        if req.lease != 0
            && !self.lessor().contains(req.lease)
            && self.limits().adopt_unknown_ttl.is_none()
        {
            return Err(Error::LeaseNotFound);
        }
        Ok(())
    }

    /// Validates a txn, then answers it from a read view when it only reads
    /// or writes it (`write.rs`).
    fn apply_txn(&self, req: TxnRequest) -> Result<(TxnResponse, i64)> {
        validate::check_txn(&req, self.limits().max_txn_ops)?;
        if validate::is_read_only(&req) {
            return self.read_txn(&req).map(|r| (r, 0));
        }
        let takes_space = alarms::txn_takes_space(&req);
        self.alarm_table().check_write(takes_space)?;
        self.write_txn(&req, None)
    }

    // ------------------------------------------------ typed commands
    //
    // What a single-member server calls: the space check, the entry
    // applied, then the caller's duties the apply path leaves out (arming
    // the timers of leases a write adopted or granted).

    /// Applies a client's `command`, sent by `by` while auth is enabled,
    /// and answers it (waits on the calling thread).
    pub fn apply_command<C: Command>(&self, command: C, by: Option<AuthInfo>) -> Result<C::Answer> {
        let entry = self.checked(command, by)?;
        let applied = self.apply(entry)?;
        self.arm_new_leases();
        C::answer(applied)
    }

    /// [`Store::apply_command`] for async callers.
    pub async fn apply_command_async<C: Command>(
        &self,
        command: C,
        by: Option<AuthInfo>,
    ) -> Result<C::Answer> {
        let entry = self.checked(command, by)?;
        let applied = self.apply_async(entry).await?;
        self.arm_new_leases();
        C::answer(applied)
    }

    /// `command`'s entry, once it passed [`Store::admit`]; a NOSPACE
    /// alarm it raises is applied here.
    fn checked<C: Command>(&self, command: C, by: Option<AuthInfo>) -> Result<Entry> {
        let entry = command.into_entry_by(by);
        match self.admit(&entry)? {
            Space::Fits => Ok(entry),
            Space::Full => Err(Error::NoSpace),
            Space::Raise(alarm) => {
                self.apply(alarm)?;
                Err(Error::NoSpace)
            }
        }
    }

    /// etcd's checks of a client's `entry` before it is applied (single
    /// member) or proposed (cluster member), in etcd's order: this
    /// member's space quota first ([`Store::check_space`]; a NOSPACE alarm
    /// to raise comes back for the caller to apply or propose), then the
    /// request itself ([`validate::check_request`]), so that a malformed
    /// request is refused where it arrived and never replicated. The
    /// permissions are checked where it applies.
    pub fn admit(&self, entry: &Entry) -> Result<Space> {
        let space = self.check_space(entry);
        if let Space::Fits = space {
            validate::check_request(entry, self.limits().max_txn_ops)?;
        }
        Ok(space)
    }

    /// Put with etcd's semantics (see [`Entry::Put`]).
    pub fn put(&self, req: PutRequest) -> Result<PutResponse> {
        self.apply_command(req, None)
    }

    /// DeleteRange with etcd's semantics.
    pub fn delete_range(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        self.apply_command(req, None)
    }

    /// Txn with etcd's semantics.
    pub fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        self.apply_command(req, None)
    }

    /// Compacts history at `rev`: reads below it fail from now on, and every
    /// key keeps its newest version at or below it (unless that is a
    /// delete). Returns the current revision.
    pub fn compact(&self, rev: i64) -> Result<i64> {
        self.apply_command(Compaction { revision: rev }, None)
    }
}

impl Store {
    /// Raises, clears or lists alarms (see [`Entry::Alarm`] and
    /// `alarms.rs`).
    pub fn alarm(
        &self,
        action: AlarmAction,
        member_id: u64,
        alarm: i32,
    ) -> Result<Vec<AlarmMember>> {
        let change = AlarmChange {
            action,
            member_id,
            alarm,
        };
        self.apply_command(change, None)
    }

    /// Every raised alarm.
    pub fn alarms(&self) -> Vec<AlarmMember> {
        self.alarm_table().all()
    }
}

fn one_op(op: RequestOp) -> TxnRequest {
    TxnRequest {
        compare: Vec::new(),
        success: vec![op],
        failure: Vec::new(),
    }
}
