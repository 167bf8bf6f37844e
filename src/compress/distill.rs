//! Knowledge distillation (Hinton et al., 2015): a student learns from a teacher's
//! softened outputs as well as from the labels.

use crate::nn::{loss, Layer, Module};
use crate::optim::Optimizer;
use crate::{Result, Tensor};

/// Temperature and weight of the distillation term.
#[derive(Clone, Copy, Debug)]
pub struct DistillOptions {
    /// Softens both distributions: `softmax(z / T)`.
    pub temperature: f64,
    /// Weight of the distillation term; `1 - alpha` weighs cross-entropy on the labels.
    pub alpha: f64,
}

impl Default for DistillOptions {
    fn default() -> Self {
        DistillOptions { temperature: 4.0, alpha: 0.7 }
    }
}

/// Hinton's loss: `alpha * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - alpha) *
/// CE(z_s, labels)`, averaged over the batch. The teacher's logits are detached.
pub fn distill_loss(student_logits: &Tensor, teacher_logits: &Tensor, labels: &Tensor, o: DistillOptions) -> Tensor {
    let kd = loss::kl_div_distill(student_logits, &teacher_logits.detach(), o.temperature);
    let ce = loss::cross_entropy(student_logits, labels);
    kd.mul_scalar(o.alpha).add(&ce.mul_scalar(1.0 - o.alpha))
}

/// One distillation step on a batch: the teacher's forward runs under `no_grad` and,
/// being lazy, joins the student's forward, backward and update in one realisation (one
/// submit on a GPU). Returns the loss.
pub fn distill_step<S: Module + Layer>(
    teacher: &dyn Layer,
    student: &mut S,
    opt: &mut dyn Optimizer,
    x: &Tensor,
    labels: &Tensor,
    o: DistillOptions,
) -> Result<f64> {
    let teacher_logits = {
        let _g = crate::no_grad();
        teacher.forward(x)
    };
    let l = distill_loss(&student.forward(x), &teacher_logits, labels, o);
    opt.step(student, &l)
}
