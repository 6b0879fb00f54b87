(* A 2-16-16-1 softsign network trained by mini-batch gradient descent to tell points
   inside a ring from points outside; prints losses and test accuracy. *)

let target x y = let r = (x *. x) +. (y *. y) in if r > 0.25 && r < 0.8 then 1. else -1.

let () =
  let epochs = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10 in
  let g = Rng.create 20240601 in
  let data n = Array.init n (fun _ -> let x = Rng.uniform g (-1.) 1. and y = Rng.uniform g (-1.) 1. in ([| x; y |], target x y)) in
  let train = data 2000 and test = data 1000 in
  let act () = Layer.map_activation Layer.softsign Layer.softsign' in
  let net =
    [ Layer.dense g ~inputs:2 ~outputs:16; act (); Layer.dense g ~inputs:16 ~outputs:16; act ();
      Layer.dense g ~inputs:16 ~outputs:1 ]
  in
  let batch = 20 in
  let loss_of set =
    Array.fold_left (fun s (x, t) -> let y = (Layer.forward net x).(0) in s +. ((y -. t) *. (y -. t))) 0. set
    /. float_of_int (Array.length set)
  in
  for e = 1 to epochs do
    Array.iteri
      (fun i (x, t) ->
        let y = (Layer.forward net x).(0) in
        Layer.backward net [| 2. *. (y -. t) /. float_of_int batch |];
        if (i + 1) mod batch = 0 then Layer.step net 0.05)
      train;
    if e = 1 || e = epochs || e mod (max 1 (epochs / 4)) = 0 then
      Printf.printf "epoch %d train loss %.4f\n" e (loss_of train)
  done;
  let correct = Array.fold_left (fun c (x, t) -> if (Layer.forward net x).(0) *. t > 0. then c + 1 else c) 0 test in
  Printf.printf "test loss %.4f accuracy %d/%d\n" (loss_of test) correct (Array.length test)
