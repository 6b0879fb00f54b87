let () =
  let n = int_of_string Sys.argv.(1) in
  let g = Grid.make 64 64 in
  for step = 1 to n do
    let a = 1.0 /. float_of_int step in
    for i = 0 to 63 do
      for j = 0 to 63 do
        Grid.update g i j (fun v -> v *. 0.999 +. a)
      done
    done
  done;
  Printf.printf "%.6f\n" (Grid.sum g)
