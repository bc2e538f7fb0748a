use crate::context::Context;
use crate::plugin::{Filter, Plugin};
use crate::pod::{PodState, Role};

/// `health`: drops unhealthy pods.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HealthFilter;

impl Plugin for HealthFilter {
    fn name(&self) -> &str {
        "health"
    }
}

impl Filter for HealthFilter {
    fn keep(&self, _: &Context, pod: &PodState) -> bool {
        pod.healthy
    }
}

/// `role`: keeps pods that can run a step of the given role (pods of role
/// `Both` run either).
#[derive(Debug, Clone, PartialEq)]
pub struct RoleFilter {
    role: Role,
    name: String,
}

impl RoleFilter {
    /// Keeps pods able to run `role` steps.
    pub fn new(role: Role) -> Self {
        RoleFilter {
            role,
            name: "role".into(),
        }
    }

    /// The same filter under another name (two role filters in one profile).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl Plugin for RoleFilter {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Filter for RoleFilter {
    fn keep(&self, _: &Context, pod: &PodState) -> bool {
        pod.role == Role::Both || pod.role == self.role || self.role == Role::Both
    }
}

/// `bounded-load`: keeps the pods whose requests in flight stay within
/// `ceil(load_factor * (in_flight_total + 1) / candidates)` after taking
/// this one (Mirrokni, Thorup and Zadimoghaddam's bound, as the
/// consistent-hash picker uses it). Beside a cache-affinity scorer it caps
/// how far affinity may pile work on one pod: a hot prefix spreads once
/// its pods are full, while ordinary traffic keeps its cache hits.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundedLoad {
    load_factor: f64,
}

impl BoundedLoad {
    /// A bound of `load_factor` (at least 1) times the mean.
    pub fn new(load_factor: f64) -> Self {
        BoundedLoad {
            load_factor: if load_factor.is_finite() {
                load_factor.max(1.0)
            } else {
                1.25
            },
        }
    }
}

impl Plugin for BoundedLoad {
    fn name(&self) -> &str {
        "bounded-load"
    }
}

impl Filter for BoundedLoad {
    /// Alone, a pod cannot be judged against the others: no opinion.
    fn keep(&self, _: &Context, _: &PodState) -> bool {
        true
    }

    fn retain(&self, _: &Context, pods: &mut Vec<PodState>) {
        let total: u64 = pods.iter().map(|p| p.in_flight as u64).sum();
        let bound =
            (self.load_factor * (total + 1) as f64 / pods.len().max(1) as f64).ceil() as u64;
        // The least loaded pod is always within the bound.
        pods.retain(|p| (p.in_flight as u64) < bound);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::PodId;

    #[test]
    fn bounded_load_keeps_pods_under_the_bound_and_never_empties() {
        let ctx = Context::new();
        let mut pods: Vec<PodState> = (0..4)
            .map(|i| {
                let mut p = PodState::new(PodId::new(i, 0), Role::Both);
                p.in_flight = [6, 1, 1, 0][i as usize];
                p
            })
            .collect();
        // total 8, bound ceil(1.25 * 9 / 4) = 3: the pod with 6 goes.
        BoundedLoad::new(1.25).retain(&ctx, &mut pods);
        assert_eq!(
            pods.iter().map(|p| p.id.slot()).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        let mut one = vec![pods[0].clone()];
        one[0].in_flight = 100;
        BoundedLoad::new(1.0).retain(&ctx, &mut one);
        assert_eq!(one.len(), 1, "a lone pod is always within the bound");
    }

    #[test]
    fn role_filter_keeps_matching_and_both() {
        let ctx = Context::new();
        let pod = |r| PodState::new(PodId::new(0, 0), r);
        let f = RoleFilter::new(Role::Prefill);
        assert!(f.keep(&ctx, &pod(Role::Prefill)));
        assert!(f.keep(&ctx, &pod(Role::Both)));
        assert!(!f.keep(&ctx, &pod(Role::Decode)));
        let any = RoleFilter::new(Role::Both);
        assert!(any.keep(&ctx, &pod(Role::Decode)));
        let mut sick = pod(Role::Both);
        sick.healthy = false;
        assert!(!HealthFilter.keep(&ctx, &sick));
        assert!(HealthFilter.keep(&ctx, &pod(Role::Both)));
    }
}
