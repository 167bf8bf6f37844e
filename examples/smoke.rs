use tessera::{DType, Device, Tensor};
fn main() {
    for a in Device::list() {
        println!("{:?}", a);
    }
    let dev = Device::new().unwrap();
    println!("{:?}", dev.info());
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0], [2, 2], &dev);
    let y = (&x * 2.0 + 1.0).relu();
    println!("{y}");
    let w = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev).reshape([2, 3]);
    println!("{}", x.matmul(&w));
    println!("{}", w.sum(&[1], false));
    println!("{}", w.softmax(-1));
    println!("{}", w.argmax(&[0], false));
    println!("{}", Tensor::eye(3, DType::F32, &dev));
    println!("{}", Tensor::randn([2, 3], 1, &dev));
    println!("{}", w.cast(DType::F16).exp());
    println!("{:?}", tessera::stats());
}
