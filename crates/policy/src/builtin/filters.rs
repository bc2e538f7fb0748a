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

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::PodId;

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
