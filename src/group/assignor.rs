//! Leader-side task assignor: maps tasks (partition numbers) to group members as active and
//! standby replicas. [`assign`] is pure and deterministic: members are sorted by id first and
//! every tie is broken by member id or task id, so the input order never matters.
//!
//! Actives: (1) a task stays on its present previous active; double claims keep the best copy
//! (highest checkpoint offset, then smallest id). (2) Orphaned tasks, in task order, go to the
//! most caught-up copy (offset, then previous standby, then fewest actives, then smallest id).
//! (3) While active counts differ by more than one, one task moves from a most-loaded to a
//! least-loaded member, choosing the task the receiver has the best copy of. No member both
//! gives and receives, so this moves the fewest tasks possible.
//!
//! Lags (KIP-441): a member's lag on a task is the changelogs' end offset sum minus its
//! checkpoint sum (0 for the task's previous active, which is running; the whole changelog
//! for a member without a copy). A member is caught up on a task within
//! `acceptable_recovery_lag`, or, when nobody is, within that lag of the least-lagging member.
//! (4) A task whose balanced owner is not caught up stays on a caught-up member (its previous
//! active first, then the fewest actives, lowest lag, smallest id): the move is deferred and
//! the balanced owner gets a warmup replica of it instead, at most `max_warmup_replicas` across
//! the group (in task order), unless it already holds a standby of the task. Warmups count
//! toward neither the active balance nor the standby quota; once they catch up, the next
//! round's balance moves their tasks (a receiver prefers its best copy).
//!
//! Standbys, per task in ascending order: start from the task's previous standbys (best copy
//! first, then least loaded), fill up with the members adding the most tag spread (then least
//! loaded, then the best copy), then apply the best strictly-improving swap of tag spread until
//! none is left. Then standbys move from a member to one with at least two tasks fewer
//! (active + standby) while a move keeps the spread. When every such move is blocked (the lighter
//! members already hold each of the heavy one's standby tasks), a chain of moves does it: the
//! heavy member passes a standby to a member that passes another one on, and so on down to a
//! lighter one (loads in between stay), so that without tags total loads end within one. Tag
//! spread of a set = sum over tag keys of the number of distinct values among the active and
//! its standbys. Because a swap must strictly improve spread, a previous standby set survives
//! unless its spread can be improved, which makes every output a fixed point.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// A task is identified by its partition number: task p owns input partition p of every input topic.
pub(crate) type TaskId = i32;

/// What one group member reported in its subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberState {
    /// The group member id (unique in the group; tie-breaks use it).
    pub(crate) member_id: String,
    /// Tasks this member ran as active in the previous generation.
    pub(crate) prev_active: BTreeSet<TaskId>,
    /// Tasks this member held as standby in the previous generation.
    pub(crate) prev_standby: BTreeSet<TaskId>,
    /// For each task whose state this member holds on disk: the sum of its stores' checkpoint
    /// offsets (higher = more caught up; all copies are prefixes of the same changelogs).
    /// A task absent from the map: no local state.
    pub(crate) task_offsets: BTreeMap<TaskId, i64>,
    /// Tasks whose copy this member itself found caught up (when it asked for
    /// this rebalance): lag 0, whatever the end offsets say now.
    pub(crate) caught_up: BTreeSet<TaskId>,
    /// Client tags (rack awareness, KIP-708 style), e.g. {"zone": "a", "rack": "r1"}.
    pub(crate) client_tags: BTreeMap<String, String>,
}

/// The tasks one member runs in the new generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct MemberAssignment {
    /// Tasks this member processes.
    pub(crate) active: BTreeSet<TaskId>,
    /// Tasks whose changelogs this member replicates as a hot standby.
    pub(crate) standby: BTreeSet<TaskId>,
    /// Tasks this member warms up: it replicates their changelogs like a
    /// standby until it is caught up, then the task moves here.
    pub(crate) warmup: BTreeSet<TaskId>,
}

/// The assignor's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AssignorConfig {
    /// Standbys per task (capped at members - 1).
    pub(crate) num_standby_replicas: usize,
    /// Records of lag up to which a member's copy counts as caught up.
    pub(crate) acceptable_recovery_lag: u64,
    /// Warmups at a time across the group.
    pub(crate) max_warmup_replicas: usize,
}

/// A move the balance wants but that waits for the target to catch up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deferred {
    pub(crate) task: TaskId,
    /// Where the task stays meanwhile, and that member's lag.
    pub(crate) kept_on: String,
    pub(crate) kept_lag: u64,
    /// Where the balance wants it, and that member's lag.
    pub(crate) target: String,
    pub(crate) target_lag: u64,
    /// Whether the target warms the task up this round (false: the warmup
    /// budget is spent, or the target holds a standby of it).
    pub(crate) warmup: bool,
}

/// The assignor's output: each member's tasks, and the deferred moves
/// (non-empty: the group must rebalance again once warmups caught up).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    pub(crate) members: Assignment,
    pub(crate) deferred: Vec<Deferred>,
}

/// The whole assignment: member id -> its tasks. Every member given in the input has an entry (possibly empty).
pub(crate) type Assignment = BTreeMap<String, MemberAssignment>;

/// How good a member's local copy of a task is: (checkpoint offset if any, was previous standby).
/// Compares naturally: any offset beats none, higher offset beats lower, then previous standby wins.
type CopyRank = (Option<i64>, bool);

/// Computes the new generation's assignment of tasks `0..tasks` to `members`, with
/// `min(num_standby_replicas, members - 1)` standbys per task and warmups for the moves that
/// wait for their target to catch up. `end_offsets`: per task, the sum of its changelogs' end
/// offsets (a task missing there is measured against the highest checkpoint any member
/// reported). See the module docs.
///
/// Member ids must be unique. Task ids outside `0..tasks` in the inputs are ignored.
pub(crate) fn assign(
    tasks: i32,
    members: &[MemberState],
    config: &AssignorConfig,
    end_offsets: &BTreeMap<TaskId, i64>,
) -> Plan {
    if members.is_empty() {
        return Plan::default();
    }
    let mut sorted: Vec<&MemberState> = members.iter().collect();
    sorted.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    debug_assert!(
        sorted.windows(2).all(|w| w[0].member_id != w[1].member_id),
        "member ids must be unique"
    );
    let ctx = Ctx::new(usize::try_from(tasks).unwrap_or(0), sorted, end_offsets);
    let mut owner = ctx.assign_actives();
    let deferred = ctx.keep_on_caught_up(&mut owner, config.acceptable_recovery_lag);
    let replicas = config.num_standby_replicas.min(ctx.members.len() - 1);
    let standbys = ctx.assign_standbys(&owner, replicas);

    let mut per_member = vec![MemberAssignment::default(); ctx.members.len()];
    for (t, (&a, sb)) in owner.iter().zip(&standbys).enumerate() {
        let task = t as TaskId;
        per_member[a].active.insert(task);
        for &s in sb {
            per_member[s].standby.insert(task);
        }
    }
    let mut warmups = 0;
    let deferred = deferred
        .into_iter()
        .map(|(t, target)| {
            let warmup = !standbys[t].contains(&target) && warmups < config.max_warmup_replicas;
            if warmup {
                warmups += 1;
                per_member[target].warmup.insert(t as TaskId);
            }
            Deferred {
                task: t as TaskId,
                kept_on: ctx.members[owner[t]].member_id.clone(),
                kept_lag: ctx.lag[owner[t]][t],
                target: ctx.members[target].member_id.clone(),
                target_lag: ctx.lag[target][t],
                warmup,
            }
        })
        .collect();
    let members = ctx
        .members
        .iter()
        .zip(per_member)
        .map(|(m, a)| (m.member_id.clone(), a))
        .collect();
    Plan { members, deferred }
}

/// Dense, index-based view of the input. Members are sorted by id, so index order is id order
/// and "smallest index" is the "smallest member id" tie-break.
struct Ctx<'a> {
    /// Members sorted by id.
    members: Vec<&'a MemberState>,
    /// Number of tasks; tasks are `0..num_tasks`.
    num_tasks: usize,
    /// `offsets[m][t]`: member m's checkpoint offset sum for task t, if it has local state.
    offsets: Vec<Vec<Option<i64>>>,
    /// `prev_standby[m][t]`: member m held task t as standby in the previous generation.
    prev_standby: Vec<Vec<bool>>,
    /// `claims[t]`: members (ascending) that ran task t as active in the previous generation.
    claims: Vec<Vec<usize>>,
    /// `tags[m][k]`: member m's interned value for the k-th tag key, if it has that key.
    tags: Vec<Vec<Option<usize>>>,
    /// Number of distinct tag keys over all members.
    num_keys: usize,
    /// `lag[m][t]`: records member m would replay to run task t (0 for a previous active).
    lag: Vec<Vec<u64>>,
}

/// Maps a task id from the input to a dense index, dropping ids outside `0..num_tasks`.
fn task_index(t: TaskId, num_tasks: usize) -> Option<usize> {
    usize::try_from(t).ok().filter(|&t| t < num_tasks)
}

impl<'a> Ctx<'a> {
    /// Builds the dense view; out-of-range task ids are dropped here.
    fn new(num_tasks: usize, members: Vec<&'a MemberState>, end_offsets: &BTreeMap<TaskId, i64>) -> Self {
        let mut offsets = vec![vec![None; num_tasks]; members.len()];
        let mut prev_standby = vec![vec![false; num_tasks]; members.len()];
        let mut claims = vec![Vec::new(); num_tasks];
        for (i, m) in members.iter().enumerate() {
            for (&t, &o) in &m.task_offsets {
                if let Some(t) = task_index(t, num_tasks) {
                    offsets[i][t] = Some(o);
                }
            }
            for &t in &m.prev_standby {
                if let Some(t) = task_index(t, num_tasks) {
                    prev_standby[i][t] = true;
                }
            }
            for &t in &m.prev_active {
                if let Some(t) = task_index(t, num_tasks) {
                    claims[t].push(i);
                }
            }
        }
        let keys: Vec<&str> = members
            .iter()
            .flat_map(|m| m.client_tags.keys().map(String::as_str))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut values: Vec<BTreeMap<&str, usize>> = vec![BTreeMap::new(); keys.len()];
        let tags = members
            .iter()
            .map(|m| {
                keys.iter()
                    .zip(values.iter_mut())
                    .map(|(key, vals)| {
                        m.client_tags.get(*key).map(|v| {
                            let next = vals.len();
                            *vals.entry(v.as_str()).or_insert(next)
                        })
                    })
                    .collect()
            })
            .collect();
        let lag = (0..members.len())
            .map(|m| {
                (0..num_tasks)
                    .map(|t| {
                        if claims[t].contains(&m) || members[m].caught_up.contains(&(t as TaskId)) {
                            return 0;
                        }
                        let end = end_offsets
                            .get(&(t as TaskId))
                            .copied()
                            .unwrap_or_else(|| offsets.iter().filter_map(|o| o[t]).max().unwrap_or(0));
                        u64::try_from(end.saturating_sub(offsets[m][t].unwrap_or(0))).unwrap_or(0)
                    })
                    .collect()
            })
            .collect();
        Ctx {
            lag,
            num_keys: keys.len(),
            members,
            num_tasks,
            offsets,
            prev_standby,
            claims,
            tags,
        }
    }

    /// Quality of member `m`'s local copy of task `t` (higher is better).
    fn copy_rank(&self, m: usize, t: usize) -> CopyRank {
        (self.offsets[m][t], self.prev_standby[m][t])
    }

    /// Whether member `m` holds any state for task `t` (an offset entry or a previous standby).
    fn has_copy(&self, m: usize, t: usize) -> bool {
        self.offsets[m][t].is_some() || self.prev_standby[m][t]
    }

    /// Places every task's active; returns `owner[t]` = member index.
    fn assign_actives(&self) -> Vec<usize> {
        let n = self.members.len();
        let mut owner = vec![usize::MAX; self.num_tasks];
        let mut sticky = vec![false; self.num_tasks];
        let mut load = vec![0usize; n];
        // Sticky: the best present claimant keeps the task (claims are ascending, so a strict
        // `>` keeps the smallest id among equal offsets; a missing offset is the lowest).
        for t in 0..self.num_tasks {
            let mut best: Option<usize> = None;
            for &i in &self.claims[t] {
                if best.is_none_or(|b| self.offsets[i][t] > self.offsets[b][t]) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                owner[t] = b;
                sticky[t] = true;
                load[b] += 1;
            }
        }
        // Orphans: most caught-up copy, then previous standby, then fewest actives, then id.
        for t in 0..self.num_tasks {
            if sticky[t] {
                continue;
            }
            let best = (0..n)
                .min_by_key(|&i| (Reverse(self.copy_rank(i, t)), load[i], i))
                .expect("at least one member");
            owner[t] = best;
            load[best] += 1;
        }
        self.balance(&mut owner, &sticky, &mut load);
        owner
    }

    /// Step (4): a task whose owner in `owner` is not caught up moves back to a caught-up
    /// member. Returns the deferred moves as (task, balanced owner), in task order.
    fn keep_on_caught_up(&self, owner: &mut [usize], acceptable: u64) -> Vec<(usize, usize)> {
        let n = self.members.len();
        let mut load = vec![0usize; n];
        for &a in owner.iter() {
            load[a] += 1;
        }
        let mut deferred = Vec::new();
        for (t, slot) in owner.iter_mut().enumerate() {
            let target = *slot;
            let least = (0..n).map(|m| self.lag[m][t]).min().expect("at least one member");
            let limit = if least <= acceptable { acceptable } else { least.saturating_add(acceptable) };
            if self.lag[target][t] <= limit {
                continue;
            }
            let keeper = (0..n)
                .filter(|&m| self.lag[m][t] <= limit)
                .min_by_key(|&m| (!self.claims[t].contains(&m), load[m], self.lag[m][t], m))
                .expect("the least-lagging member is within the limit");
            load[target] -= 1;
            load[keeper] += 1;
            *slot = keeper;
            deferred.push((t, target));
        }
        deferred
    }

    /// Moves tasks from most-loaded to least-loaded members until active counts differ by at
    /// most one. Each move picks, over all (most-loaded task, least-loaded receiver) pairs, the
    /// best receiver copy, then a task that was not sticky, then the smallest task id, then the
    /// smallest receiver id.
    fn balance(&self, owner: &mut [usize], sticky: &[bool], load: &mut [usize]) {
        let n = self.members.len();
        // Per member: tasks it has a copy of, in the order it would like to receive them.
        let prefs: Vec<Vec<usize>> = (0..n)
            .map(|m| {
                let mut v: Vec<usize> = (0..self.num_tasks)
                    .filter(|&t| self.has_copy(m, t))
                    .collect();
                v.sort_by_key(|&t| (Reverse(self.copy_rank(m, t)), sticky[t], t));
                v
            })
            .collect();
        loop {
            let max = *load.iter().max().expect("at least one member");
            let min = *load.iter().min().expect("at least one member");
            if max - min <= 1 {
                return;
            }
            let mut best: Option<(Reverse<CopyRank>, bool, usize, usize)> = None;
            for r in (0..n).filter(|&r| load[r] == min) {
                if let Some(&t) = prefs[r].iter().find(|&&t| load[owner[t]] == max) {
                    let key = (Reverse(self.copy_rank(r, t)), sticky[t], t, r);
                    if best.is_none_or(|b| key < b) {
                        best = Some(key);
                    }
                }
            }
            let (t, r) = match best {
                Some((_, _, t, r)) => (t, r),
                None => {
                    // No receiver has a copy of any movable task: any task will do.
                    let r = (0..n)
                        .find(|&r| load[r] == min)
                        .expect("a least-loaded member");
                    let t = (0..self.num_tasks)
                        .filter(|&t| load[owner[t]] == max)
                        .min_by_key(|&t| (sticky[t], t))
                        .expect("a most-loaded member owns a task");
                    (t, r)
                }
            };
            load[owner[t]] -= 1;
            owner[t] = r;
            load[r] += 1;
        }
    }

    /// Tag spread of the active plus `set`: sum over tag keys of the number of distinct values.
    /// A member without a key adds nothing for it (an unknown location is not spread).
    fn spread(&self, active: usize, set: &[usize]) -> usize {
        let mut seen: Vec<usize> = Vec::with_capacity(set.len() + 1);
        let mut total = 0;
        for k in 0..self.num_keys {
            seen.clear();
            for &m in std::iter::once(&active).chain(set) {
                if let Some(v) = self.tags[m][k] {
                    if !seen.contains(&v) {
                        seen.push(v);
                    }
                }
            }
            total += seen.len();
        }
        total
    }

    /// Places `replicas` standbys per task (tasks in ascending order); returns the standby
    /// member indexes of each task.
    fn assign_standbys(&self, owner: &[usize], replicas: usize) -> Vec<Vec<usize>> {
        let n = self.members.len();
        // Total (active + standby) load so far.
        let mut load = vec![0usize; n];
        for &a in owner {
            load[a] += 1;
        }
        let mut result = Vec::with_capacity(self.num_tasks);
        for (t, &active) in owner.iter().enumerate() {
            // Sticky start: the previous standbys (best copy first). A copy
            // left on disk alone does not make a standby sticky: a member
            // that once held many tasks would keep standbys of all of them.
            let mut chosen: Vec<usize> = (0..n)
                .filter(|&m| m != active && self.prev_standby[m][t])
                .collect();
            chosen.sort_by_key(|&m| (Reverse(self.copy_rank(m, t)), load[m], m));
            chosen.truncate(replicas);
            // Fill: most added spread, then least loaded, then the best
            // copy, then smallest id.
            while chosen.len() < replicas {
                let base = self.spread(active, &chosen);
                let mut trial = chosen.clone();
                let x = (0..n)
                    .filter(|&m| m != active && !chosen.contains(&m))
                    .min_by_key(|&m| {
                        trial.push(m);
                        let gain = self.spread(active, &trial) - base;
                        trial.pop();
                        (Reverse(gain), load[m], Reverse(self.copy_rank(m, t)), m)
                    })
                    .expect("replicas < members");
                chosen.push(x);
            }
            self.improve_spread(t, active, &mut chosen, &load);
            for &s in &chosen {
                load[s] += 1;
            }
            result.push(chosen);
        }
        self.balance_standbys(owner, &mut result, &mut load);
        result
    }

    /// Moves standbys from a member to one carrying at least two tasks
    /// fewer (active + standby) until no such move remains. A move never
    /// puts a standby beside its active or a second copy on one member,
    /// never lowers the task's tag spread and leaves no strictly better
    /// spread swap behind (so the result stays a fixed point). Each move
    /// takes the largest load difference, then the receiver's best copy,
    /// then the smallest task and receiver. When every such move is blocked
    /// (the lighter members already hold the heavy one's standby tasks), a
    /// chain of moves through members that pass one standby on each is
    /// tried (see [`Ctx::standby_chain`]). Terminates: every move or chain
    /// lowers the sum of squared loads.
    fn balance_standbys(&self, owner: &[usize], sets: &mut [Vec<usize>], load: &mut [usize]) {
        let n = self.members.len();
        loop {
            // (move key, task, position in its standby set, receiver)
            type Move = ((Reverse<usize>, Reverse<CopyRank>, usize, usize), usize, usize, usize);
            let mut best: Option<Move> = None;
            for t in 0..sets.len() {
                for pos in 0..sets[t].len() {
                    let from = sets[t][pos];
                    for to in 0..n {
                        if to == owner[t] || sets[t].contains(&to) || load[from] <= load[to] + 1 {
                            continue;
                        }
                        let key = (Reverse(load[from] - load[to]), Reverse(self.copy_rank(to, t)), t, to);
                        if best.as_ref().is_some_and(|(b, ..)| *b <= key) {
                            continue;
                        }
                        if !self.move_keeps_spread(t, owner[t], &sets[t], pos, to, load) {
                            continue;
                        }
                        best = Some((key, t, pos, to));
                    }
                }
            }
            let moves = match best {
                Some((_, t, pos, to)) => vec![(t, pos, to)],
                None => self.standby_chain(owner, sets, load),
            };
            if moves.is_empty() {
                return;
            }
            for (t, pos, to) in moves {
                let from = sets[t][pos];
                sets[t][pos] = to;
                load[from] -= 1;
                load[to] += 1;
            }
        }
    }

    /// Whether replacing standby `set[pos]` of task `t` (active `active`) by `to` keeps the
    /// tag spread and leaves no strictly improving swap behind (always true without tags).
    fn move_keeps_spread(&self, t: usize, active: usize, set: &[usize], pos: usize, to: usize, load: &[usize]) -> bool {
        if self.num_keys == 0 {
            return true;
        }
        let mut trial = set.to_vec();
        trial[pos] = to;
        if self.spread(active, &trial) < self.spread(active, set) {
            return false;
        }
        let mut check = trial.clone();
        self.improve_spread(t, active, &mut check, load);
        check == trial
    }

    /// A chain of standby moves s -> m1 -> ... -> r, each member passing one standby on to
    /// the next, so that only s (one task less) and r (one more) change load, with
    /// `load[r] + 2 <= load[s]`. Each step is a move `balance_standbys` allows, judged on the
    /// current sets; the tasks along a chain are distinct, so the steps do not interfere.
    /// Breadth-first from every member; picks the largest load difference, then the
    /// shortest chain, then the smallest s and r; a step to a member takes its best copy,
    /// then the smallest task. Returns the moves as (task, position in its standby set,
    /// receiver), empty if there is no chain.
    fn standby_chain(&self, owner: &[usize], sets: &[Vec<usize>], load: &[usize]) -> Vec<(usize, usize, usize)> {
        let n = self.members.len();
        let max = *load.iter().max().expect("at least one member");
        let min = *load.iter().min().expect("at least one member");
        if max < min + 2 {
            return Vec::new();
        }
        // steps[from]: (to, task, position) for every allowed single move.
        let mut steps: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n];
        for (t, set) in sets.iter().enumerate() {
            for (pos, &from) in set.iter().enumerate() {
                for to in 0..n {
                    if to != owner[t] && !set.contains(&to) && self.move_keeps_spread(t, owner[t], set, pos, to, load) {
                        steps[from].push((to, t, pos));
                    }
                }
            }
        }
        for v in &mut steps {
            v.sort_by_key(|&(to, t, _)| (to, Reverse(self.copy_rank(to, t)), t));
        }
        // (key, chain)
        type Chain = ((Reverse<usize>, usize, usize, usize), Vec<(usize, usize, usize)>);
        let mut best: Option<Chain> = None;
        for s in (0..n).filter(|&s| load[s] >= min + 2) {
            // via[m]: the step that reached m, and m's depth.
            let mut via: Vec<Option<(usize, usize, usize)>> = vec![None; n];
            let mut depth = vec![usize::MAX; n];
            depth[s] = 0;
            let mut queue = std::collections::VecDeque::from([s]);
            while let Some(u) = queue.pop_front() {
                // The tasks already moved on the way to u.
                let mut used = Vec::new();
                let mut m = u;
                while let Some((prev, t, _)) = via[m] {
                    used.push(t);
                    m = prev;
                }
                for &(to, t, pos) in &steps[u] {
                    if depth[to] != usize::MAX || used.contains(&t) {
                        continue;
                    }
                    depth[to] = depth[u] + 1;
                    via[to] = Some((u, t, pos));
                    queue.push_back(to);
                }
            }
            for r in (0..n).filter(|&r| depth[r] != usize::MAX && load[r] + 2 <= load[s]) {
                let key = (Reverse(load[s] - load[r]), depth[r], s, r);
                if best.as_ref().is_some_and(|(b, _)| *b <= key) {
                    continue;
                }
                let mut chain = Vec::new();
                let mut m = r;
                while let Some((prev, t, pos)) = via[m] {
                    chain.push((t, pos, m));
                    m = prev;
                }
                chain.reverse();
                best = Some((key, chain));
            }
        }
        best.map(|(_, chain)| chain).unwrap_or_default()
    }

    /// Applies the best strictly-improving single swap (standby out, other member in) of tag
    /// spread until none exists. Ties between swaps: larger spread, then the incoming member's
    /// better copy, lower load, smaller id, then evicting the worst copy, highest load, largest id.
    fn improve_spread(&self, t: usize, active: usize, chosen: &mut [usize], load: &[usize]) {
        if self.num_keys == 0 || chosen.is_empty() {
            return;
        }
        type SwapKey = (
            Reverse<usize>,
            Reverse<CopyRank>,
            usize,
            usize,
            CopyRank,
            Reverse<usize>,
            Reverse<usize>,
        );
        loop {
            let current = self.spread(active, chosen);
            let mut best: Option<(SwapKey, usize, usize)> = None;
            for pos in 0..chosen.len() {
                let out = chosen[pos];
                for x in 0..self.members.len() {
                    if x == active || chosen.contains(&x) {
                        continue;
                    }
                    chosen[pos] = x;
                    let s = self.spread(active, chosen);
                    chosen[pos] = out;
                    if s <= current {
                        continue;
                    }
                    let key = (
                        Reverse(s),
                        Reverse(self.copy_rank(x, t)),
                        load[x],
                        x,
                        self.copy_rank(out, t),
                        Reverse(load[out]),
                        Reverse(out),
                    );
                    if best.as_ref().is_none_or(|(b, _, _)| key < *b) {
                        best = Some((key, pos, x));
                    }
                }
            }
            match best {
                Some((_, pos, x)) => chosen[pos] = x,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
